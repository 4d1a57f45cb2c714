"""The application factory: settings, Redis (embedded or external), the engine, routes, errors.

>>> app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))
>>> app.title
'opml-service'
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from service.api import auth, deps, observe, problems
from service.api.forward import Forwarder, OwnerRouting
from service.api.lean import LeanPath
from service.api.limits import BodyLimit
from service.api.main import api_router
from service.config import Settings, get_settings
from service.core import warm_up
from service.engine.registry import Registry
from service.security import KeyRing
from service.storage.embedded import EmbeddedRedis
from service.storage.store import Store, redacted_url

log = logging.getLogger("service")


def advertised_url(settings: Settings) -> str:
    """Where other processes reach this one (``OPML_ADVERTISE_URL``, else from host and port).

    >>> advertised_url(Settings(host="127.0.0.1", port=8000))
    'http://127.0.0.1:8000'
    """
    if settings.advertise_url:
        return settings.advertise_url.rstrip("/")
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def _operation_id(route: APIRoute) -> str:
    """Stable OpenAPI operation ids: the route function's name (e.g. ``create_model``)."""
    return route.name


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start Redis (embedded unless ``OPML_REDIS_URL``) and the models; stop them in reverse."""
    settings: Settings = app.state.settings
    # Compile the learning kernel (or load it from numba's cache) before anything is served.
    await asyncio.to_thread(warm_up)
    embedded: EmbeddedRedis | None = None
    url = settings.redis_url
    if url is None:
        embedded = EmbeddedRedis(settings.data_dir, settings.redis_appendfsync)
        url = await asyncio.to_thread(embedded.start)  # supervised: restarted if it dies
    else:
        log.info("using Redis at %s", redacted_url(url))
    store = Store.connect(url, settings.redis_timeout_s, wait_replicas=settings.redis_wait_replicas)
    models = Registry(store, settings, advertised_url(settings))
    app.state.models = models
    app.state.forwarder = Forwarder(
        models.owner_id, settings.apply_wait_s + settings.min_version_wait_s + 10
    )
    observe.watch(lambda: [rt.status() for rt in models.runtimes.values() if rt.serving])
    models.start()
    try:
        yield
    finally:
        await models.close()
        observe.watch(tuple)
        await app.state.forwarder.aclose()
        await store.aclose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        log.info("stopped")


WS_DESCRIPTION = """\
**WebSocket `/v1/models/{name}/stream`** (not listed below: OpenAPI has no WebSocket routes).
Client frames are JSON text, `{"id", "samples": [{x, y}, ...]}` or `{"id", "x", "y"}`, or
**binary** messages (the handshake answer carries `x-opml-frames: json, binary`):

    uint32 little-endian H | H bytes of UTF-8 JSON {"id": <frame id>, "y": [label, ...]} |
    len(y) x dim float64 little-endian values, row-major (one row per label)

A binary frame means exactly the JSON frame with the same id and samples (the two encodings
share idempotency: a resend in either is acknowledged with the original seqs). A malformed one
(short, header not JSON, block of the wrong length, NaN/Inf in the block: `errors[0].loc =
["block", row]`) is answered by an `error` frame; the connection stays open. Answers: one
`{"ack", "first_seq", "last_seq"}` or `{"error", "id"}` text frame per client frame, in order.

**Binary one-to-many `POST /v1/models/{name}/distance`**: `Content-Type: application/x-npz`,
the bytes of `np.savez(f, a=a, b=B)` (a: (d,), B: (n, d), float64 or float32; never unpickled;
at most `OPML_MAX_BODY_BYTES` as float64); refusals are 422 problems naming `body`, `body.a` or
`body.b`. `Accept: application/x-npy` (either body) answers the squared distances as `.npy`
bytes (float64, (n,)) with header `X-Version`.
"""


#: FastAPI's native OpenTelemetry (newer FastAPI) looks for a configured provider on every
#: request (environment lookups, ~10 us each time); the service exports Prometheus metrics.
_NO_OTEL: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured application (nothing starts until its lifespan runs)."""
    settings = settings or get_settings()
    app = FastAPI(
        **_NO_OTEL,
        title="opml-service",
        version="1.0.0",
        summary="Streaming online metric learning (OPML / COPML) with a durable Redis log.",
        description=WS_DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
    )
    app.state.settings = settings
    problems.install(app)
    app.include_router(api_router)
    deps.document_bodies(app)
    auth.document(app)
    if settings.lean_path:
        # innermost: the lean path of distance/verify, wrapped by the body limit, auth, metrics
        app.add_middleware(LeanPath)
    # a model another process learns: its requests go there (after auth and the body limit)
    app.add_middleware(OwnerRouting)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # before BodyLimit and the routes: a caller without the right key never gets a body read
    app.add_middleware(auth.Authenticate, keys=KeyRing.parse(settings.api_keys))
    app.add_middleware(observe.HttpMetrics)  # outermost: times and counts every answer
    return app
