"""The asyncio client: :class:`AsyncOPMLClient` (httpx) and its ingestion :class:`AsyncStream`
(websockets).

Requests and answers are defined once in :mod:`clients._wire`; this module only waits.
``clients/sync.py`` is generated from ``clients/aio.py`` by ``python scripts/unasync.py`` (CI
runs it with ``--check``): edit ``clients/aio.py`` and regenerate, never ``clients/sync.py``.
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
from clients.errors import Forbidden, from_problem
from clients.estimator import estimator_for
from clients.retry import RetryPolicy
from clients.types import (
    Array,
    Certificate,
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
    from clients.estimator import Estimator

#: Failures of a WebSocket that a reconnect may cure.
WS_TRANSIENT = (ConnectionClosed, OSError, TimeoutError)


async def _ws_enter(
    scope: contextlib.AsyncExitStack, url: str, timeout: float, headers: dict[str, str]
) -> ClientConnection:
    """Open a WebSocket inside ``scope``; a refused handshake raises its APIError (4xx) or a
    ConnectionError (5xx, transient)."""
    try:
        # Frames are float64 blocks and JSON sent over a LAN: deflate costs more than it saves.
        return await scope.enter_async_context(
            connect(
                url,
                additional_headers=headers,
                open_timeout=timeout,
                max_size=None,
                compression=None,
            )
        )
    except InvalidStatus as exc:
        response = exc.response
        raise _wire.handshake_refusal(response.status_code, response.body, url) from None


async def _recv(ws: ClientConnection, timeout: float | None) -> str | bytes:
    """The next message; TimeoutError when none comes within ``timeout`` seconds (0: only a
    message already received; None: no limit)."""
    # asyncio.timeout(0), unlike wait_for(..., 0) on Python 3.11, lets recv() return a message
    # that is already there before the deadline fires.
    async with asyncio.timeout(timeout):
        return await ws.recv()


class AsyncStream:
    """Ingestion over ``WS /v1/models/{name}/stream`` with a bounded window of unacked frames.

    Opening it reads the model once, so that :meth:`send` refuses rows of the wrong width before
    sending (a ValueError naming ``X``; with an API key that may not read the model, the
    service's own check is the only one). :meth:`send` waits while ``window`` frames wait for
    their ack, and collects the acks already there after each frame, so ``on_progress`` (called
    with the :class:`Progress` after every ack) follows the service. A dropped connection is
    reopened (bounded by the client's :class:`RetryPolicy`) and every unacknowledged frame is
    sent again with its id, which the service acknowledges without logging it twice. Leaving
    the ``async with`` block waits for the last acks and closes the socket (on an exception it
    closes at once).

    Example (against a running service)::

        async with client.stream("faces", window=32) as stream:
            for X_chunk, y_chunk in chunks:
                await stream.send(X_chunk, y_chunk)
        stream.progress.acked_samples
        # -> 10000
    """

    def __init__(
        self,
        client: AsyncOPMLClient,
        name: str,
        *,
        window: int,
        on_progress: Callable[[Progress], None] | None,
        ack_timeout: float | None,
        binary: bool | None = None,
    ) -> None:
        self._client = client
        self._url = _wire.ws_url(client.base_url, name, "/stream")
        self._window = _wire.Window(window, client.retry, on_progress, binary, name, self._url)
        self._ack_timeout = ack_timeout
        self._ws: ClientConnection | None = None
        self._scope = contextlib.AsyncExitStack()

    @property
    def progress(self) -> Progress:
        return self._window.progress

    @property
    def dim(self) -> int | None:
        """The model's dimension, read when the stream opened (None: the API key may not read
        the model, or the stream is not open yet)."""
        return self._window.dim

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
        """Read the model's dim, then connect (retrying transient failures); ``async with``
        calls it. NotFound if the model does not exist."""
        try:
            model = await self._client.get_model(self._window.model)
            self._window.dim = model.dim
        except Forbidden:  # an ingest-only key may not read the model
            self._window.dim = None
        while True:
            try:
                await self._attach()
                return
            except WS_TRANSIENT as exc:
                await asyncio.sleep(self._window.next_delay(exc))

    async def _attach(self) -> ClientConnection:
        self._scope = contextlib.AsyncExitStack()
        client = self._client
        self._ws = await _ws_enter(self._scope, self._url, client.timeout, client.headers)
        self._window.connected(_wire.frames_header(self._ws))
        return self._ws

    async def send(
        self, X: Any, y: Any, *, frame_id: int | str | None = None, holdout: Any = None
    ) -> int | str:
        """Send the rows of ``X`` with labels ``y`` as one frame (or one sample: ``X`` 1-D and
        ``y`` a label); its id is returned. Ids are generated unless given; a given id must be
        unique on the model, as the service de-duplicates by it. ``holdout``: booleans (one
        bool for one sample), True for rows to route to the certification reservoir."""
        frame = self._window.frame(X, y, frame_id, holdout)
        while self._window.full:
            await self._receive(self._ack_timeout)
        self._window.add(frame)
        await self._transmit(self._window.payload(frame))
        with contextlib.suppress(TimeoutError):  # collect acks already there, keep progress live
            while self._window.pending:
                await self._receive(0)
        return frame.id

    async def flush(self) -> None:
        """Wait until every frame sent so far is acknowledged."""
        while self._window.pending:
            await self._receive(self._ack_timeout)

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

    async def _receive(self, timeout: float | None) -> None:
        """Read one message and act on it (TimeoutError if ``timeout == 0`` and none is there)."""
        assert self._ws is not None, "the stream is not open"
        try:
            text = await _recv(self._ws, timeout)
        except TimeoutError:
            if timeout == 0:
                raise
            await self._reconnect(TimeoutError(f"no ack within {timeout} s"))
            return
        except (ConnectionClosed, OSError) as exc:
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
        # Messages that arrived before the drop still count (an ack, or why we were closed).
        with contextlib.suppress(*WS_TRANSIENT):
            while True:
                self._window.receive(await _recv(ws, 0))
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
    """asyncio client of the opml-service HTTP/WebSocket API (``/v1``).

    Vectors and matrices may be lists or numpy arrays; answers are typed objects (numpy for
    vectors and matrices). Errors raise :class:`clients.errors.APIError` subclasses carrying the
    problem+json members; 503s and dropped connections are retried per ``retry``. ``api_key``
    is sent as ``Authorization: Bearer <key>`` on every request and WebSocket handshake;
    ``headers`` go on both too.

    Example (against a running service)::

        from clients import AsyncOPMLClient
        async with AsyncOPMLClient("http://127.0.0.1:8000") as client:
            await client.create_model("faces", dim=3)
            await client.ingest("faces", [[0, 0, 1], [0, 1, 0]], ["ann", "bob"], wait=True)
            d = await client.distance("faces", [0, 0, 1], [0, 1, 0])    # d.distance, d.version
            L = await client.metric("faces")                       # numpy (d, d)
            est = await client.to_sklearn("faces")                 # a fitted service.core COPML
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        headers: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.headers = dict(headers or {})
        if api_key is not None:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, headers=self.headers
        )

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
            if self.retry.gives_up(attempt, failure) or not _wire.should_retry(call, failure):
                raise _wire.give_up(failure, self.base_url + call.path) from failure
            await asyncio.sleep(self.retry.delay(attempt, getattr(failure, "retry_after", None)))
            attempt += 1

    # -- models --------------------------------------------------------------------------------

    async def create_model(
        self,
        name: str,
        dim: int,
        *,
        algorithm: Literal["copml", "opml", "sgd", "sgd_psd", "brm", "lda"] | None = None,
        step: Literal["scaled", "paper", "constant", "descent", "invsqrt"] | None = None,
        gamma: float | Literal["auto"] | None = None,
        gamma_pair: float | None = None,
        margin: float | None = None,
        normalize: Literal["none", "l2"] | None = None,
        seed: int | None = None,
        auto_warmup: int | None = None,
        rehearsal: int | None = None,
        rehearsal_memory: int | None = None,
        eta: float | None = None,
        mu: float | None = None,
        kappa: float | None = None,
        lam: float | None = None,
        **options: Any,
    ) -> Model:
        """Create a model (409 :class:`~clients.errors.Conflict` if the name exists; 422
        :class:`~clients.errors.InvalidInput` naming the field out of its range).

        Hyperparameters left ``None`` take the service's defaults, which depend on the
        algorithm. ``step`` is one field whose values depend on it: for ``opml`` / ``copml``
        ``"scaled"`` (the default: ``gamma``, ``gamma_pair`` and ``margin`` in units of the
        stream's typical squared difference) or ``"paper"`` (the paper's rule, in the input's
        units); for ``sgd``, ``sgd_psd`` and ``brm`` ``"constant"``, ``"descent"`` (the
        default) or ``"invsqrt"``. ``gamma`` is OPML/COPML's step; ``gamma="auto"`` (with
        ``auto_warmup``, opml/copml only) has the service race step sizes on the first
        ``auto_warmup`` triplets and keep the best (``Model.race`` says which won).
        ``rehearsal`` (opml/copml; default 0) follows each learned sample with that many steps on
        samples drawn from a reservoir of ``rehearsal_memory`` past ones (default 1000). ``eta``,
        ``kappa`` (descent rule only) and ``lam`` belong to ``sgd``, ``sgd_psd`` and ``brm``,
        ``mu`` to the first two; for ``brm``, ``margin`` is tau < 1 (the ranges are in
        docs/guides/algorithms.md). ``algorithm="lda"`` serves Fisher's discriminant metric,
        refreshed every ``refresh`` samples (an option, like ``shrinkage``);
        ``precondition="whiten"`` or ``"discriminant"`` (an option; opml, copml, sgd) learns on
        within-class whitened or discriminant-weighted inputs. A hyperparameter, or a ``step``
        value, the algorithm does not use is refused (:class:`~clients.errors.InvalidInput`,
        naming it). ``options`` passes members the
        service accepts beyond the contract (e.g. ``calibration_window``).
        """
        hyper = dict(
            algorithm=algorithm,
            step=step,
            gamma=gamma,
            gamma_pair=gamma_pair,
            margin=margin,
            normalize=normalize,
            seed=seed,
            auto_warmup=auto_warmup,
            rehearsal=rehearsal,
            rehearsal_memory=rehearsal_memory,
            eta=eta,
            mu=mu,
            kappa=kappa,
            lam=lam,
            **options,
        )
        return await self._send(_wire.create_model(name, dim, hyper))

    async def list_models(self) -> list[Model]:
        return await self._send(_wire.list_models())

    async def get_model(self, name: str) -> Model:
        return await self._send(_wire.get_model(name))

    async def delete_model(self, name: str) -> None:
        """Delete a model and all its state."""
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
        holdout: Any = None,
    ) -> Ingested:
        """Append the rows of ``X`` with labels ``y`` (applied in order) in one request.

        ``wait=True`` answers once they are applied, with per-sample ``results``. A retried
        request carries the same ``Idempotency-Key`` (generated when not given), so a retry
        never logs a sample twice. ``holdout``: booleans, True for rows to route to the
        certification reservoir (never learned; e.g. a separate validation set).
        """
        body = {"samples": _wire.samples(X, y, holdout)}
        return await self._send(_wire.ingest(body, name, wait, idempotency_key))

    async def ingest_one(
        self,
        name: str,
        x: Any,
        y: int | str,
        *,
        wait: bool = False,
        idempotency_key: str | None = None,
        holdout: bool = False,
    ) -> Ingested:
        """Append one sample (the ``{x, y}`` form of the request); ``holdout=True`` routes it
        to the certification reservoir."""
        body: dict[str, Any] = {"x": _wire.vector(x, "x"), "y": _wire.label(y)}
        if holdout:
            body["holdout"] = True
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
        """An :class:`AsyncStream` to ``name`` (use it with ``async with``).

        ``ack_timeout``: seconds to wait for an ack before treating the connection as dead.
        ``binary``: send binary frames (raw float64 block, no JSON number formatting): None
        (default) when the service says it reads them (``x-opml-frames`` handshake header),
        True always, False never (JSON frames).
        """
        return AsyncStream(
            self,
            name,
            window=window,
            on_progress=on_progress,
            ack_timeout=ack_timeout,
            binary=binary,
        )

    async def events(self, name: str, *, interval_ms: int | None = None) -> AsyncIterator[Event]:
        """Follow ``WS .../events``: yields an :class:`Event` per model change, reconnecting
        after a drop (bounded by the retry policy); stop by breaking out of the loop."""
        params = {} if interval_ms is None else {"interval_ms": interval_ms}
        url = _wire.ws_url(self.base_url, name, "/events", params)
        failures = 0
        while True:
            try:
                async with contextlib.AsyncExitStack() as scope:
                    ws = await _ws_enter(scope, url, self.timeout, self.headers)
                    async for text in ws:
                        doc = json.loads(text)
                        if "error" in doc:
                            raise from_problem(int(doc["error"].get("status", 500)), doc["error"])
                        failures = 0
                        yield Event.from_json(doc)
            except WS_TRANSIENT as exc:
                if self.retry.gives_up(failures, exc):
                    raise _wire.give_up(exc, url) from exc
            await asyncio.sleep(self.retry.delay(failures))
            failures += 1

    # -- queries -------------------------------------------------------------------------------

    async def distance(
        self,
        name: str,
        a: Any,
        b: Any,
        *,
        min_version: int | None = None,
        restricted: bool = False,
    ) -> Distance:
        """Distance between vectors ``a`` and ``b`` under the live metric (Eqs. 1, 2);
        ``restricted=True`` adds the restricted distance ``D_R`` (a ``brm`` model always does)."""
        return await self._send(_wire.distance(name, a, b, min_version, restricted))

    async def distances(
        self,
        name: str,
        a: Any,
        B: Any,
        *,
        min_version: int | None = None,
        binary: bool | None = None,
        restricted: bool = False,
    ) -> Distances:
        """Distances from ``a`` to every row of ``B`` (one to many).

        ``binary``: send the gallery as an ``.npz`` body and read the answer as ``.npy`` bytes
        (no JSON numbers either way; float32 arrays go as float32). None (default): when ``B``
        is a 2-D numpy array of at least ``_wire.BINARY_MATRIX_VALUES`` values; False: JSON.
        ``restricted=True`` adds the restricted distances (the answer is then JSON).
        """
        return await self._send(_wire.distances(name, a, B, min_version, binary, restricted))

    async def verify(
        self,
        name: str,
        a: Any,
        b: Any,
        *,
        threshold: float | None = None,
        min_version: int | None = None,
        far: float | None = None,
        frr: float | None = None,
    ) -> Verdict:
        """Same class? ``squared_distance <= threshold`` (the model's calibrated one if None;
        ``threshold_source`` of the answer says which was used). ``far`` / ``frr`` (instead
        of ``threshold``, in (0, 0.5)): decide at the threshold whose certified false-accept
        (false-reject) rate is at most that; the answer's ``operating_point`` has the bounds.
        409 :class:`~clients.errors.Conflict` when the held-out samples cannot certify it."""
        return await self._send(_wire.verify(name, a, b, threshold, min_version, far, frr))

    async def roc(
        self,
        name: str,
        *,
        points: int = 20,
        delta: float = 0.05,
        min_version: int | None = None,
        csv: bool = False,
    ) -> Any:
        """The served metric's ROC on the held-out reservoir: a dict with ``points`` (each
        ``threshold``, ``far_estimate``, ``far_bound``, ``frr_estimate``, ``frr_bound``,
        ``window_far``, ``window_frr``); ``csv=True``: the CSV text."""
        if csv:
            return await self._send(_wire.roc_csv(name, points, delta, min_version))
        return await self._send(_wire.roc(name, points, delta, min_version))

    async def transform(self, name: str, X: Any, *, min_version: int | None = None) -> Transformed:
        """``z = x L^T`` for every row of ``X``."""
        return await self._send(_wire.transform(name, X, min_version))

    async def metric(self, name: str, *, min_version: int | None = None) -> Array:
        """``L`` as a ``(d, d)`` numpy array (fetched as ``.npy`` bytes, bit-exact)."""
        return await self._send(_wire.metric(name, min_version))

    async def metric_snapshot(self, name: str, *, min_version: int | None = None) -> MetricSnapshot:
        """``L`` together with the ``version`` it belongs to (the JSON form)."""
        return await self._send(_wire.metric_snapshot(name, min_version))

    async def certificate(
        self,
        name: str,
        *,
        delta: float = 0.05,
        method: Literal["binomial", "kl", "pac-bayes"] = "binomial",
        threshold: float | None = None,
        min_version: int | None = None,
    ) -> Certificate:
        """High-confidence bounds on the triplet error, false accept and false reject rates of
        the served metric (at ``threshold``, default the served one), holding together with
        probability ``>= 1 - delta`` (docs/guides/certificates.md). 409
        :class:`~clients.errors.Conflict` while too few samples are held out (its ``extra``
        has ``needed`` and ``have``)."""
        return await self._send(_wire.certificate(name, delta, method, threshold, min_version))

    async def put_metric(self, name: str, L: Any) -> Model:
        """Replace ``L`` (warm start from a matrix learned elsewhere)."""
        return await self._send(_wire.put_metric(name, L))

    async def to_sklearn(self, name: str, *, min_version: int | None = None) -> Estimator:
        """A fitted estimator of the model's algorithm (:class:`service.core.OPML`,
        :class:`~service.core.COPML`, :class:`~service.core.SGD`, :class:`~service.core.SGDPSD`
        or :class:`~service.core.BRM`) holding the live L.

        For offline use (``transform``, ``pair_distance``, pipelines); see
        :func:`clients.estimator.estimator_for`.
        """
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
        far: float | None = None,
        frr: float | None = None,
    ) -> _wire.Identified:
        """See :meth:`clients.OPMLClient.identify`."""
        return await self._send(_wire.identify(name, x, k, threshold, min_version, far, frr))

    async def identify_many(
        self,
        name: str,
        X: Any,
        *,
        k: int = 1,
        threshold: float | None = None,
        min_version: int | None = None,
        binary: bool | None = None,
        far: float | None = None,
        frr: float | None = None,
    ) -> _wire.IdentifiedMany:
        """See :meth:`clients.OPMLClient.identify_many`."""
        return await self._send(
            _wire.identify_many(name, X, k, threshold, min_version, binary, far, frr)
        )

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
        """Readiness (503 :class:`~clients.errors.Unavailable` while not ready, after retries)."""
        return await self._send(_wire.readyz())

    async def prometheus_metrics(self) -> str:
        """The ``/metrics`` Prometheus text."""
        return await self._send(_wire.prometheus())

    async def openapi(self) -> dict[str, Any]:
        return await self._send(_wire.openapi())
