"""Operations: liveness, readiness, Prometheus telemetry (``GET /metrics``)."""

from __future__ import annotations

from concurrent.futures import Future

from fastapi import APIRouter, Request, Response

from service import telemetry
from service.api.deps import ModelsDep
from service.errors import StorageUnavailable, Unavailable

router = APIRouter(tags=["operations"])


_ALIVE = b'{"status":"ok"}'


@router.get("/livez", response_model=dict[str, str])
async def livez() -> Response:
    """The process is alive (no dependency checks)."""
    return Response(_ALIVE, media_type="application/json")


#: ``/readyz``'s detail while the learning kernels compile (the first start of an installation).
COMPILING = "compiling the learning kernels (first start only)"


@router.get(
    "/readyz",
    responses={503: {"description": "Redis unreachable, kernels compiling, or models loading."}},
)
async def readyz(request: Request, models: ModelsDep) -> dict[str, object]:
    """Redis answers, the learning kernels are compiled and every model is loaded (checkpoint
    + log tail applied)."""
    try:
        await models.store.ping()
    except StorageUnavailable as exc:
        telemetry.REDIS_ERROR["readyz"].inc()
        raise Unavailable(f"Redis is unreachable ({type(exc.__cause__ or exc).__name__})") from None
    kernels: Future[None] = request.app.state.kernels
    if not kernels.done():
        raise Unavailable(COMPILING, retry_after=5)
    if kernels.exception() is not None:
        raise Unavailable("the learning kernels failed to compile; see the service log")
    if not models.loaded.is_set():
        raise Unavailable("models are still being loaded")
    return {"status": "ok", "models": len(models.runtimes)}


@router.get("/metrics", response_class=Response)
async def metrics() -> Response:
    """Prometheus text exposition."""
    body, content_type = telemetry.render()
    return Response(body, media_type=content_type)
