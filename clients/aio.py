"""The asyncio client: :class:`AsyncOPMLClient` and :class:`AsyncStream`.

The same operations, answers, retries and window as :mod:`clients.sync` (all defined in
:mod:`clients._wire`), awaited instead of blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from clients import _wire
from clients.errors import from_problem
from clients.estimator import estimator_for
from clients.retry import RetryPolicy
from clients.types import (
    Array,
    Distance,
    Distances,
    Event,
    Ingested,
    MetricSnapshot,
    Model,
    Progress,
    Transformed,
    Verdict,
)

if TYPE_CHECKING:
    from service.core import COPML, OPML

WS_TRANSIENT = (ConnectionClosed, OSError, TimeoutError)


async def _ws_enter(
    scope: contextlib.AsyncExitStack, url: str, open_timeout: float
) -> ClientConnection:
    """Open a WebSocket inside ``scope``; a refused 4xx handshake becomes its APIError."""
    try:
        return await scope.enter_async_context(
            connect(url, open_timeout=open_timeout, max_size=None, compression=None)
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status >= 500:
            raise ConnectionError(f"handshake answered {status}") from exc
        raise from_problem(status, exc.response.body.decode(errors="replace")) from None


class AsyncStream:
    """:class:`clients.sync.Stream` for asyncio: a bounded window of unacknowledged frames,
    reconnect with resend of unacked frames under the same ids, progress after every ack.

    Acks are read while the window is full and on :meth:`flush`, so ``on_progress`` runs at
    those points.

    Example (against a running service)::

        async with client.stream("faces") as stream:
            await stream.send(X, y)
    """

    def __init__(
        self,
        url: str,
        *,
        window: int,
        retry: RetryPolicy,
        on_progress: Callable[[Progress], None] | None,
        open_timeout: float,
        ack_timeout: float | None,
        binary: bool | None = None,
    ) -> None:
        self._url = url
        self._window = _wire.Window(window, retry, on_progress, binary)
        self._open_timeout = open_timeout
        self._ack_timeout = ack_timeout
        self._ws: ClientConnection | None = None
        self._scope = contextlib.AsyncExitStack()

    @property
    def progress(self) -> Progress:
        return self._window.progress

    async def __aenter__(self) -> AsyncStream:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
        else:
            await self._drop()

    async def open(self) -> None:
        """Connect (retrying transient failures); ``async with`` calls it."""
        while True:
            try:
                await self._attach()
                return
            except WS_TRANSIENT as exc:
                await asyncio.sleep(self._window.next_delay(exc))

    async def _attach(self) -> ClientConnection:
        self._scope = contextlib.AsyncExitStack()
        self._ws = await _ws_enter(self._scope, self._url, self._open_timeout)
        self._window.connected(_wire.frames_header(self._ws))
        return self._ws

    async def send(self, X: Any, y: Any, *, frame_id: int | str | None = None) -> int | str:
        """Send one frame (see :meth:`clients.sync.Stream.send`); returns its id."""
        frame = self._window.frame(X, y, frame_id)
        while self._window.full:
            await self._receive()
        self._window.add(frame)
        await self._transmit(self._window.payload(frame))
        return frame.id

    async def flush(self) -> None:
        """Wait until every frame sent so far is acknowledged."""
        while self._window.pending:
            await self._receive()

    async def close(self) -> None:
        """:meth:`flush`, then close the connection."""
        await self.flush()
        await self._drop()

    async def _drop(self) -> None:
        await self._scope.aclose()
        self._ws = None

    async def _transmit(self, text: str | bytes) -> None:
        assert self._ws is not None, "the stream is not open"
        try:
            await self._ws.send(text)
        except WS_TRANSIENT as exc:
            await self._reconnect(exc)

    async def _receive(self) -> None:
        assert self._ws is not None, "the stream is not open"
        try:
            text = await asyncio.wait_for(self._ws.recv(), self._ack_timeout)
        except WS_TRANSIENT as exc:
            await self._reconnect(exc)
            return
        again = self._window.receive(text)
        if again is not None:
            await asyncio.sleep(self._window.next_delay(RuntimeError("frame answered 503")))
            await self._transmit(self._window.payload(again))

    async def _reconnect(self, cause: BaseException) -> None:
        """Reopen the connection and resend every unacknowledged frame, in order."""
        ws = self._ws
        assert ws is not None
        with contextlib.suppress(*WS_TRANSIENT):  # messages that arrived before the drop
            while True:
                self._window.receive(await asyncio.wait_for(ws.recv(), 0.01))
        await self._drop()
        refused = _wire.close_problem(ws.close_code, ws.close_reason or "")
        if refused is not None:
            raise refused
        while True:
            await asyncio.sleep(self._window.next_delay(cause))
            try:
                fresh = await self._attach()
                for frame in list(self._window.pending.values()):
                    await fresh.send(self._window.payload(frame))
            except WS_TRANSIENT as exc:
                await self._drop()
                cause = exc
                continue
            self.progress.reconnects += 1
            return


class AsyncOPMLClient:
    """asyncio client of the opml-service API: the methods of :class:`clients.OPMLClient`,
    awaited.

    Example (against a running service)::

        from clients import AsyncOPMLClient
        async with AsyncOPMLClient("http://127.0.0.1:8000") as client:
            await client.create_model("faces", dim=3)
            async with client.stream("faces") as stream:
                await stream.send([[0, 0, 1], [0, 1, 0]], ["ann", "bob"])
            L = await client.metric("faces")
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=headers)

    async def __aenter__(self) -> AsyncOPMLClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _wire.Call[_wire.T]) -> _wire.T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    json=call.json,
                    content=call.content,
                    params=call.params,
                    headers=call.headers,
                )
                if response.is_success:
                    return call.parse(response)
                failure: Exception = _wire.problem(response)
            except httpx.TransportError as exc:
                failure = exc
            if attempt >= self.retry.attempts or not _wire.should_retry(call, failure):
                raise _wire.give_up(failure) from failure
            await asyncio.sleep(self.retry.delay(attempt, getattr(failure, "retry_after", None)))
            attempt += 1

    # -- models --------------------------------------------------------------------------------

    async def create_model(
        self,
        name: str,
        dim: int,
        *,
        algorithm: Literal["copml", "opml"] | None = None,
        gamma: float | None = None,
        gamma_pair: float | None = None,
        margin: float | None = None,
        normalize: Literal["none", "l2"] | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> Model:
        """See :meth:`clients.OPMLClient.create_model`."""
        hyper = dict(
            algorithm=algorithm,
            gamma=gamma,
            gamma_pair=gamma_pair,
            margin=margin,
            normalize=normalize,
            seed=seed,
            **options,
        )
        return await self._send(_wire.create_model(name, dim, hyper))

    async def list_models(self) -> list[Model]:
        return await self._send(_wire.list_models())

    async def get_model(self, name: str) -> Model:
        return await self._send(_wire.get_model(name))

    async def delete_model(self, name: str) -> None:
        await self._send(_wire.delete_model(name))

    # -- ingestion -----------------------------------------------------------------------------

    async def ingest(
        self,
        name: str,
        X: Any,
        y: Any,
        *,
        wait: bool = False,
        idempotency_key: str | None = None,
    ) -> Ingested:
        """See :meth:`clients.OPMLClient.ingest`."""
        body = {"samples": _wire.samples(X, y)}
        return await self._send(_wire.ingest(body, name, wait, idempotency_key))

    async def ingest_one(
        self,
        name: str,
        x: Any,
        y: int | str,
        *,
        wait: bool = False,
        idempotency_key: str | None = None,
    ) -> Ingested:
        body = {"x": _wire.vector(x, "x"), "y": _wire.label(y)}
        return await self._send(_wire.ingest(body, name, wait, idempotency_key))

    def stream(
        self,
        name: str,
        *,
        window: int = 32,
        on_progress: Callable[[Progress], None] | None = None,
        ack_timeout: float | None = 60.0,
        binary: bool | None = None,
    ) -> AsyncStream:
        """An :class:`AsyncStream` to ``name`` (use it with ``async with``)."""
        return AsyncStream(
            _wire.ws_url(self.base_url, f"/v1/models/{name}/stream"),
            window=window,
            retry=self.retry,
            on_progress=on_progress,
            open_timeout=self.timeout,
            ack_timeout=ack_timeout,
            binary=binary,
        )

    async def events(self, name: str, *, interval_ms: int | None = None) -> AsyncIterator[Event]:
        """See :meth:`clients.OPMLClient.events`."""
        params = {} if interval_ms is None else {"interval_ms": interval_ms}
        url = _wire.ws_url(self.base_url, f"/v1/models/{name}/events", params)
        failures = 0
        while True:
            try:
                async with contextlib.AsyncExitStack() as scope:
                    ws = await _ws_enter(scope, url, self.timeout)
                    async for text in ws:
                        doc = json.loads(text)
                        if "error" in doc:
                            raise from_problem(int(doc["error"].get("status", 500)), doc["error"])
                        failures = 0
                        yield Event.from_json(doc)
            except WS_TRANSIENT as exc:
                if failures >= self.retry.attempts:
                    raise _wire.give_up(exc) from exc
            await asyncio.sleep(self.retry.delay(failures))
            failures += 1

    # -- queries -------------------------------------------------------------------------------

    async def distance(
        self, name: str, a: Any, b: Any, *, min_version: int | None = None
    ) -> Distance:
        return await self._send(_wire.distance(name, a, b, min_version))

    async def distances(
        self,
        name: str,
        a: Any,
        B: Any,
        *,
        min_version: int | None = None,
        binary: bool | None = None,
    ) -> Distances:
        """One to many; ``binary`` as in :meth:`OPMLClient.distances` (.npz / .npy)."""
        return await self._send(_wire.distances(name, a, B, min_version, binary))

    async def verify(
        self,
        name: str,
        a: Any,
        b: Any,
        *,
        threshold: float | None = None,
        min_version: int | None = None,
    ) -> Verdict:
        return await self._send(_wire.verify(name, a, b, threshold, min_version))

    async def transform(self, name: str, X: Any, *, min_version: int | None = None) -> Transformed:
        return await self._send(_wire.transform(name, X, min_version))

    async def metric(self, name: str, *, min_version: int | None = None) -> Array:
        """``L`` as a numpy array (``.npy`` bytes, bit-exact)."""
        return await self._send(_wire.metric(name, min_version))

    async def metric_snapshot(self, name: str, *, min_version: int | None = None) -> MetricSnapshot:
        return await self._send(_wire.metric_snapshot(name, min_version))

    async def put_metric(self, name: str, L: Any) -> Model:
        return await self._send(_wire.put_metric(name, L))

    async def to_sklearn(self, name: str, *, min_version: int | None = None) -> OPML | COPML:
        """See :meth:`clients.OPMLClient.to_sklearn`."""
        model = await self.get_model(name)
        return estimator_for(model, await self.metric(name, min_version=min_version))

    # -- gallery and identification ---------------------------------------------------------

    async def enroll(
        self, name: str, ids: Any, X: Any, y: Any = None, *, idempotency_key: str | None = None
    ) -> _wire.Enrolled:
        """See :meth:`clients.OPMLClient.enroll`."""
        return await self._send(_wire.enroll(name, ids, X, y, idempotency_key))

    async def identify(
        self,
        name: str,
        x: Any,
        *,
        k: int = 1,
        threshold: float | None = None,
        min_version: int | None = None,
    ) -> _wire.Identified:
        """See :meth:`clients.OPMLClient.identify`."""
        return await self._send(_wire.identify(name, x, k, threshold, min_version))

    async def identify_many(
        self,
        name: str,
        X: Any,
        *,
        k: int = 1,
        threshold: float | None = None,
        min_version: int | None = None,
        binary: bool | None = None,
    ) -> _wire.IdentifiedMany:
        """See :meth:`clients.OPMLClient.identify_many`."""
        return await self._send(_wire.identify_many(name, X, k, threshold, min_version, binary))

    async def gallery_list(
        self, name: str, *, cursor: str | None = None, limit: int | None = None
    ) -> _wire.GalleryPage:
        """See :meth:`clients.OPMLClient.gallery_list`."""
        return await self._send(_wire.gallery_list(name, cursor, limit))

    async def gallery_delete(self, name: str, item_id: int | str) -> None:
        """See :meth:`clients.OPMLClient.gallery_delete`."""
        await self._send(_wire.gallery_delete(name, item_id))

    # -- operations ----------------------------------------------------------------------------

    async def livez(self) -> dict[str, Any]:
        return await self._send(_wire.livez())

    async def readyz(self) -> dict[str, Any]:
        return await self._send(_wire.readyz())

    async def prometheus_metrics(self) -> str:
        return await self._send(_wire.prometheus())

    async def openapi(self) -> dict[str, Any]:
        return await self._send(_wire.openapi())
