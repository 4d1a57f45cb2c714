"""The API router: every route module, gathered."""

from fastapi import APIRouter

from service.api.routes import console, gallery, models, ops, queries, samples, stream

api_router = APIRouter()
for module in (models, samples, queries, gallery, stream, ops, console):
    api_router.include_router(module.router)
