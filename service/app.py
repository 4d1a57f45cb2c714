"""The application factory: settings, Redis, the engine, routes, errors, the docs pages.

>>> app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))
>>> app.title
'opml-service'

* **Redis**: ``OPML_REDIS_URL``, or the URL given to :func:`create_app` (the command line,
  :mod:`service.__main__`, starts the embedded redis-server before the app and stops it after).
* **Learning kernels**: the numba kernels compile (or load from numba's on-disk cache) in a
  thread of their own from the app's start; the server answers meanwhile (``/livez``), and
  ``/readyz`` answers 503 saying so until they are ready. Nothing else waits for them but the
  learners' first batches.
* **Docs pages**: ``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from the
  service itself (``/static-offline-docs/``, the files of the ``fastapi-offline`` package), not
  from a CDN, and no web fonts: they work on a closed network. Swagger UI's online validator
  badge is off for the same reason.
"""

from __future__ import annotations

import inspect
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp

from service.api import auth, deps, observe, problems
from service.api.forward import Forwarder, OwnerRouting
from service.api.lean import LeanPath
from service.api.limits import BodyLimit
from service.api.router import api_router
from service.config import Settings, get_settings
from service.core import gallery, warm_up
from service.engine.registry import Registry
from service.security import KeyRing
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


def compile_kernels() -> Future[None]:
    """Compile the learning kernels (or load them from numba's cache) in a daemon thread; the
    future is done when they are ready (a daemon: a stop during the first compilation does not
    wait for it; numba writes its cache files atomically)."""
    done: Future[None] = Future()

    def run() -> None:
        started = time.perf_counter()
        try:
            warm_up()
            gallery.warm_up()
        except Exception as exc:  # reported by /readyz; the learners fail on their own
            log.exception("the learning kernels failed to compile")
            done.set_exception(exc)
            return
        done.set_result(None)
        log.info("learning kernels ready after %.1f s", time.perf_counter() - started)

    log.info(
        "compiling the learning kernels in the background (first start only: later starts load "
        "them from numba's cache in about a second); /readyz answers 503 until they are ready"
    )
    threading.Thread(target=run, name="compile-kernels", daemon=True).start()
    return done


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the kernels' compilation, the Redis client and the models; stop them in reverse."""
    settings: Settings = app.state.settings
    url: str | None = app.state.redis_url
    if url is None:
        raise RuntimeError(
            "no Redis: set OPML_REDIS_URL, or start the service with its command line "
            "(python -m service), which runs the embedded redis-server"
        )
    app.state.kernels = compile_kernels()
    if settings.redis_url is not None:
        log.info("using Redis at %s", redacted_url(url))
    store = Store.connect(url, settings.redis_timeout_s, wait_replicas=settings.redis_wait_replicas)
    models = Registry(store, settings, advertised_url(settings))
    app.state.models = models
    app.state.forwarder = Forwarder(
        models.owner_id, settings.apply_wait_s + settings.min_version_wait_s + 10
    )
    observe.watch(
        lambda: [rt.status() for rt in models.runtimes.values() if rt.serving],
        settings.certificate_false_accept_target,
    )
    models.start()
    try:
        yield
    finally:
        await models.close()
        observe.watch(tuple)
        await app.state.forwarder.aclose()
        await store.aclose()
        log.info("stopped")


WS_DESCRIPTION = """\
**WebSocket `/v1/models/{name}/stream`** (not listed below: OpenAPI has no WebSocket routes).
Client frames are JSON text, `{"id", "samples": [{x, y}, ...]}` or `{"id", "x", "y"}`, or
**binary** messages (the handshake answer carries `x-opml-frames: json, binary`):

    uint32 little-endian H | H bytes of UTF-8 JSON {"id": <frame id>, "y": [label, ...]} |
    len(y) x dim float64 little-endian values, row-major (one row per label)

(the header may add `"holdout": [bool, ...]`, one per label, as JSON samples carry
`"holdout": true`: those samples go to the certification reservoir, never learned)

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
#: request (environment lookups, each time); the service's telemetry is Prometheus.
_NO_OTEL: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: Settings | None = None, redis_url: str | None = None) -> FastAPI:
    """A configured application on ``settings.redis_url``, else on ``redis_url`` (nothing
    starts until its lifespan runs)."""
    settings = settings or get_settings()
    keys = KeyRing.parse(settings.api_keys)

    def outer(app: ASGIApp) -> ASGIApp:
        """The service's layers, innermost first, around FastAPI's whole per-request stack
        (its error handling, exception mapping, routing, dependencies). ``add_middleware``
        would put them inside FastAPI's error and telemetry layers, which every request then
        crosses; around the stack, a request the lean path answers (:mod:`service.api.lean`:
        ingestion, the hot queries, ``/livez``) crosses only the service's layers."""
        if settings.lean_path:
            app = LeanPath(app)  # the hot requests without FastAPI's machinery
        # a model another process learns: its requests go there (after auth and the body limit)
        app = OwnerRouting(app)
        app = BodyLimit(app, max_bytes=settings.max_body_bytes)
        # before BodyLimit and the routes: a caller without the right key never gets a body read
        app = auth.Authenticate(app, keys=keys)
        app = observe.HttpTelemetry(app)  # times and counts every answer
        # what escapes a layer of ours is a 500 problem, as FastAPI's error layer answers
        return ServerErrorMiddleware(app, handler=problems.on_unexpected)

    app = FastAPIOffline(
        **_NO_OTEL,
        title="opml-service",
        version=metadata.version("opml-service"),  # the package's: one version number
        summary="Streaming online metric learning (OPML / COPML) with a durable Redis log.",
        description=WS_DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        swagger_ui_parameters={"validatorUrl": None},  # no request to the online validator
    )
    # FastAPIOffline returns a plain FastAPI (with the offline docs pages): its stack builder,
    # called once at the first request, is wrapped on the instance.
    fastapi_stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: outer(fastapi_stack())  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.keys = keys
    app.state.redis_url = settings.redis_url or redis_url
    problems.install(app)
    app.include_router(api_router)
    deps.document_bodies(app)
    auth.document(app, keys)
    return app
