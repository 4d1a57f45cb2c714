"""The application in the test process: ``create_app`` on a real redis-server (the session's
``redis_url``, a database of its own), its lifespan run on an event loop in a thread of its
own, and requests through httpx's ASGI transport (no socket, no subprocess).

``api`` is a plain :class:`httpx.Client`, so the tests read like the service tests that talk
to a subprocess over TCP; each request is handed to the app's event loop and waited for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from fastapi import FastAPI

from service.app import create_app
from service.config import Settings
from tests.service.support import SHARED_ENV

#: A request waits at most this long (a bound on a busy machine, not a timing assertion).
REQUEST_TIMEOUT_S = 120.0


class LoopTransport(httpx.BaseTransport):
    """A synchronous transport that runs each request through :class:`httpx.ASGITransport` on
    the app's event loop (another thread) and returns the whole answer."""

    def __init__(self, app: FastAPI, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            answer = await self._inner.handle_async_request(request)
            content = await answer.aread()
            return httpx.Response(answer.status_code, headers=answer.headers, content=content)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(REQUEST_TIMEOUT_S)


class InProcessApp:
    """The app and its event loop; :meth:`close` ends the lifespan (models, Redis client) and
    the loop's thread, each wait bounded."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="app-loop", daemon=True)
        self._lifespan: AbstractAsyncContextManager[Any] | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(REQUEST_TIMEOUT_S)

    def start(self) -> InProcessApp:
        self._thread.start()
        self._lifespan = self.app.router.lifespan_context(self.app)
        self._run(self._lifespan.__aenter__())
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until ``/readyz`` answers 200 (models loaded, kernels compiled or loaded from
        numba's cache): a bound for a cold cache on a busy machine, not a timing assertion."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while (ready := client.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, f"not ready in {timeout_s} s: {ready.text}"
                time.sleep(0.05)

    def client(self) -> httpx.Client:
        return httpx.Client(
            transport=LoopTransport(self.app, self.loop), base_url="http://in-process"
        )

    def close(self) -> None:
        try:
            if self._lifespan is not None:
                self._run(self._lifespan.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)


@pytest.fixture(scope="session")
def in_process(redis_url: str) -> Iterator[InProcessApp]:
    """One app for the session on database 3 of the session's redis-server (the subprocess
    services use 0 and 1: no model is ever shared), with the shared service's limits."""
    url = urlunsplit(urlsplit(redis_url)._replace(path="/3"))
    options = {key.removeprefix("OPML_").lower(): value for key, value in SHARED_ENV.items()}
    app = InProcessApp(Settings(redis_url=url, **options)).start()
    try:
        app.wait_ready()
        yield app
    finally:
        app.close()


@pytest.fixture
def api(in_process: InProcessApp) -> Iterator[httpx.Client]:
    with in_process.client() as client:
        yield client
