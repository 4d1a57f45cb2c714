"""Requests for a model that another process learns are forwarded to that process.

Several service processes may run behind one load balancer; each model is learned by exactly
one of them (its owner, :mod:`service.engine.registry`). Any process serves what needs no
learner state: ingestion without ``?wait=true`` (``POST .../samples``, ``WS .../stream``: any
process may append to a model's log), creating and listing models. Everything else about a model
(its document, queries, ``min_version``, ``?wait=true``, ``PUT``/``GET metric``, ``/events``,
``DELETE``) is answered by its owner: :class:`OwnerRouting` forwards the request over a
keep-alive connection pool (a WebSocket is relayed frame by frame) and passes the owner's answer
back unchanged (problem+json included), with ``Authorization`` and ``Idempotency-Key`` kept.

Why forwarding rather than a ``307`` to the owner: behind a load balancer the clients often
cannot reach the processes' own addresses, a redirect would need every client (curl, browsers,
other SDKs) to follow and cache it, and a WebSocket handshake cannot be redirected by most
clients. The price is one extra loopback/LAN hop for those requests; ingestion, the hot path of
a stream, never pays it.

A forwarding loop cannot happen: a forwarded request carries ``X-OPML-Forwarded-By``, and a
process that receives one for a model it does not serve answers ``503`` with ``Retry-After``
instead of forwarding again. The same ``503`` answers while a model changes hands (its lease is
free, or its new owner is still loading it), for about the lease TTL at most: never a stale or
wrong answer. Answers given by another process carry ``X-OPML-Served-By: <member id>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import httpx
from pydantic import ValidationError
from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from service.api import parsing
from service.api.problems import problem_response, response_for
from service.api.schemas import NAME_PATTERN
from service.engine.registry import Registry
from service.errors import NotFound, Unavailable

HOP_HEADER = "x-opml-forwarded-by"
SERVED_BY_HEADER = "x-opml-served-by"

_MODEL_PATH = re.compile(r"/v1/models/(" + NAME_PATTERN.strip("^$") + r")(?:/([a-z]+)(?:/.+)?)?")
#: Headers that describe one connection, not the request (RFC 9110 Sec. 7.6.1), or that the
#: forwarding client sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip


def served_anywhere(method: str, tail: str | None, query: bytes) -> bool:
    """True for the requests any process answers itself (see the module docstring).

    >>> served_anywhere("POST", "samples", b""), served_anywhere("POST", "samples", b"wait=y")
    (True, False)
    >>> served_anywhere("WS", "stream", b""), served_anywhere("GET", "metric", b"")
    (True, False)
    """
    if tail == "stream":
        return True
    if method == "POST" and tail == "samples":
        if not query:  # the common case, without parsing a query string
            return True
        try:
            return not parsing.wait(QueryParams(query).get("wait"))
        except ValidationError:  # not a boolean: answered 422 here
            return True
    return False


class Forwarder:
    """The keep-alive pool requests are forwarded over (one per process)."""

    def __init__(self, member_id: str, timeout_s: float) -> None:
        self.member_id = member_id
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=2.0),
                limits=httpx.Limits(max_keepalive_connections=64),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def headers(self, scope: Scope) -> list[tuple[str, str]]:
        """The request's end-to-end headers, plus the hop header."""
        out = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in _HOP_BY_HOP and k != HOP_HEADER.encode()
        ]
        out.append((HOP_HEADER, self.member_id))
        return out

    async def http(self, scope: Scope, body: bytes, target: str, member: str) -> Response:
        """Send the request to ``target`` (a base URL) and return its answer."""
        url = target + scope["path"]
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode("latin-1")
        try:
            answer = await self.client.request(
                scope["method"], url, content=body, headers=self.headers(scope)
            )
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"the process that learns this model ({member}) did not answer "
                f"({type(exc).__name__}); retry shortly",
                retry_after=1,
            ) from None
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers.pop("content-encoding", None)  # httpx decoded the body
        headers[SERVED_BY_HEADER] = member
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    async def model_document(
        self, name: str, target: str, member: str, authorization: str | None = None
    ) -> Any:
        """The owner's document of model ``name`` (for the model list), asked with the caller's
        ``authorization`` header: the owner checks the key as for any request."""
        headers = [(HOP_HEADER, self.member_id)]
        if authorization is not None:
            headers.append(("authorization", authorization))
        answer = await self.client.get(f"{target}/v1/models/{name}", headers=headers)
        if answer.status_code != 200:
            raise Unavailable(
                f"model {name!r}: its owner ({member}) answered {answer.status_code}; retry",
                retry_after=1,
            )
        return answer.json()

    async def websocket(
        self, scope: Scope, receive: Receive, send: Send, target: str, member: str
    ) -> None:
        """Relay a WebSocket to ``target``: its handshake answer (a refusal included), then
        every frame both ways, then its close code."""
        url = "ws" + target.removeprefix("http") + scope["path"]
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode("latin-1")
        client = WebSocket(scope, receive, send)
        headers = [(k, v) for k, v in self.headers(scope) if not k.lower().startswith("sec-")]
        try:
            upstream = await connect(
                url,
                additional_headers=headers,
                subprotocols=scope.get("subprotocols") or None,
                open_timeout=5,
                max_size=None,
                compression=None,
            )
        except InvalidStatus as exc:  # the owner refused the handshake: pass its answer on
            refused = exc.response
            await Response(
                refused.body, status_code=refused.status_code, headers=dict(refused.headers)
            )(scope, receive, send)
            return
        except (OSError, TimeoutError) as exc:
            await problem_response(
                Unavailable(f"the owner of this model did not answer ({type(exc).__name__})")
            )(scope, receive, send)
            return
        async with upstream:
            await client.accept(
                subprotocol=upstream.subprotocol,
                headers=[(SERVED_BY_HEADER.encode(), member.encode())],
            )
            await _pump(client, upstream)


async def _pump(client: WebSocket, upstream: ClientConnection) -> None:
    async def down() -> None:  # owner -> client
        try:
            async for message in upstream:
                if isinstance(message, bytes):
                    await client.send_bytes(message)
                else:
                    await client.send_text(message)
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):
            await client.close(code if code != 1006 else 1011)

    async def up() -> None:  # client -> owner
        try:
            while True:
                message = await client.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes") is not None:
                    await upstream.send(message["bytes"])
                elif message.get("text") is not None:
                    await upstream.send(message["text"])
        except (WebSocketDisconnect, ConnectionClosed):
            pass
        await upstream.close()

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class OwnerRouting:
    """ASGI middleware: a model's request goes to the process that learns it (see above)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        match = _MODEL_PATH.fullmatch(scope["path"])
        method = "WS" if scope["type"] == "websocket" else scope["method"]
        if match is None or served_anywhere(method, match.group(2), scope["query_string"]):
            await self.app(scope, receive, send)
            return
        try:
            target = await self._target(scope, match.group(1))
        except Exception as exc:  # outside FastAPI's error layer: answered as it would
            await response_for(exc)(scope, receive, send)
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        forwarder: Forwarder = scope["app"].state.forwarder
        member, url = target
        if scope["type"] == "websocket":
            await forwarder.websocket(scope, receive, send, url, member)
            return
        try:
            body = await _read_body(receive)
            response = await forwarder.http(scope, body, url, member)
        except Exception as exc:  # as above (a body over OPML_MAX_BODY_BYTES among them)
            response = response_for(exc)
        await response(scope, receive, send)

    async def _target(self, scope: Scope, name: str) -> tuple[str, str] | None:
        """Where the request goes: None for this process (it learns the model, or the route
        answers, e.g. 404), else the owner's (member id, URL); Unavailable while the model
        changes hands or when a forwarded request reached a process that does not learn it."""
        models: Registry = scope["app"].state.models
        if not models.loaded.is_set():
            return None  # the route answers 503 "still loading"
        try:
            runtime = await models.lookup(name)
        except NotFound:
            return None
        if runtime.serving:
            return None
        holder = await models.holder(name)
        if holder is None and await models.gone(name):
            return None  # deleted meanwhile: the route answers 404
        if (
            Headers(scope=scope).get(HOP_HEADER) is not None
            or holder is None
            or (holder[0] == models.owner_id)
        ):
            raise Unavailable(
                f"model {name!r} is changing hands between service processes; retry shortly",
                retry_after=1,
            )
        return holder


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
