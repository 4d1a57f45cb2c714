"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from redis.exceptions import RedisError

from service import telemetry
from service.api.deps import ModelsDep
from service.errors import Unavailable

router = APIRouter(tags=["operations"])


_ALIVE = b'{"status":"ok"}'


@router.get("/livez", response_model=dict[str, str])
async def livez() -> Response:
    """The process is alive (no dependency checks)."""
    return Response(_ALIVE, media_type="application/json")


@router.get("/readyz", responses={503: {"description": "Redis unreachable or still loading."}})
async def readyz(models: ModelsDep) -> dict[str, object]:
    """Redis answers and every model is loaded (checkpoint + log tail applied)."""
    try:
        await models.store.ping()
    except RedisError as exc:
        telemetry.REDIS_ERROR["readyz"].inc()
        raise Unavailable(f"Redis is unreachable ({type(exc).__name__})") from None
    if not models.loaded.is_set():
        raise Unavailable("models are still being loaded")
    return {"status": "ok", "models": len(models.runtimes)}


@router.get("/metrics", response_class=Response)
async def metrics() -> Response:
    """Prometheus text exposition."""
    body, content_type = telemetry.render()
    return Response(body, media_type=content_type)
