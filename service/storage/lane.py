"""The append lane: one pipelined connection to a single Redis server for the hot scripts.

Every sample a client sends is acknowledged after its Lua append returned. Through redis-py's
client that call costs about as much CPU as the rest of a one-sample request (its connection
pool, retry and timeout layers and its Python reply path, per call); sent on a connection of our
own, packed by hiredis and read by a hiredis reader in the connection's protocol, it costs less
than half of that (docs/design/append-lane.md). :class:`Lane` is that connection; the store
(:meth:`~service.storage.client.Connection.run_replicated`) sends the appends of samples and
metrics through it when it can, everything else through redis-py.

Semantics are redis-py's, as the store uses it:

* Calls are pipelined in call order (Redis answers in order); each call's reply or error goes
  to its own caller. An error reply raises the exception redis-py raises for it (its parser's
  ``parse_error``); ``NOSCRIPT`` (a restarted server) sends the script itself (``EVAL``),
  which runs it once and caches it again, as redis-py's script object reloads it.
* A call waits at most ``timeout_s`` for its reply (``OPML_REDIS_TIMEOUT_S``, redis-py's socket
  timeout): past it the connection is closed and every call still waiting on it fails with
  :class:`redis.exceptions.TimeoutError`, as redis-py fails a call and drops its connection.
  Nothing is retried (a call that failed after it was sent may have run: the store's caller
  answers 503, and the client retries with its idempotency key / frame id).
* A lost connection fails the calls waiting on it with
  :class:`~redis.exceptions.ConnectionError`; the next call connects again (a server restart is
  seen as soon as the socket closes, with no health check needed).
* It connects as redis-py would (``AUTH``, ``SELECT``, ``CLIENT SETNAME``), over TCP or a Unix
  socket. A server it does not speak to in that way (TLS, RESP3, a credential provider) has no
  lane (:meth:`Lane.of` gives None) and every call goes through redis-py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError, DataError, InvalidResponse, NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeout

#: An argument longer than this (bytes) makes :func:`pack_command` pack the command itself:
#: hiredis's packer costs about 1 ms per MB from 64 KB up (25x its cost per byte at 16 KB),
#: and a binary frame of 1,024 samples at d = 64 is 512 KB.
LARGE_ARGUMENT = 16_384
_BUFFERS = (bytes, memoryview)


def pack_command(command: tuple[Any, ...]) -> list[bytes | memoryview]:
    r"""The RESP bytes of ``command``, in parts: those of ``hiredis.pack_command`` (numbers as
    ``repr``, strings as UTF-8; TypeError or ValueError for an argument it does not take),
    packed by hiredis unless an argument of bytes is longer than :data:`LARGE_ARGUMENT`; then
    that argument is a part of its own, not copied.

    >>> pack_command(("SET", "k", 12))
    [b'*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n']
    >>> big = ("EVALSHA", "f" * 40, 1, "k", b"x" * 20_000)
    >>> b"".join(pack_command(big)) == hiredis.pack_command(big)
    True
    """
    for arg in command:
        if type(arg) in _BUFFERS and len(arg) > LARGE_ARGUMENT:
            break
    else:
        return [hiredis.pack_command(command)]
    parts: list[bytes | memoryview] = []
    head = [b"*%d\r\n" % len(command)]  # the small pieces between large arguments, joined
    for arg in command:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is int:
            arg = b"%d" % arg
        elif not (kind is bytes or (kind is memoryview and arg.format == "B")):
            # a float or anything else: hiredis's own rules (and its refusals)
            return [hiredis.pack_command(command)]
        head.append(b"$%d\r\n" % len(arg))
        if len(arg) > LARGE_ARGUMENT:
            parts += (b"".join(head), arg)
            head = [b"\r\n"]
        else:
            head += (arg, b"\r\n")
    parts.append(b"".join(head))
    return parts


#: A lane's timeouts when its client has none (redis-py's would wait for ever; the store always
#: sets them: OPML_REDIS_TIMEOUT_S).
DEFAULT_TIMEOUT_S = 5.0


class Endpoint(NamedTuple):
    """Where a lane connects and how it introduces itself (from a redis-py pool's options)."""

    host: str = "localhost"
    port: int = 6379
    path: str = ""  #: a Unix socket, instead of host and port
    db: int = 0
    username: str | None = None
    password: str | None = None
    client_name: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_TIMEOUT_S

    def __str__(self) -> str:
        return self.path or f"{self.host}:{self.port}"

    def handshake(self) -> list[tuple[Any, ...]]:
        """The commands a new connection sends before any call (as redis-py's does)."""
        commands: list[tuple[Any, ...]] = []
        if self.password is not None:
            user = () if self.username is None else (self.username,)
            commands.append(("AUTH", *user, self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        if self.client_name:
            commands.append(("CLIENT", "SETNAME", self.client_name))
        return commands


class _Protocol(asyncio.Protocol):
    """The lane's connection: writes calls, hands each reply to the oldest waiting call."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        #: Set once the connection is closed or lost: no call is written on it any more.
        self.lost = False
        # Error replies become the exceptions redis-py raises for them, by its own parser's
        # table (as its hiredis parser does).
        self._reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )
        #: The calls written and not yet answered, oldest first, with their deadlines.
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def call(self, packed: list[bytes | memoryview]) -> asyncio.Future[Any]:
        """Write one packed command (:func:`pack_command`'s parts); its reply (or error)
        comes to the returned future."""
        assert self.transport is not None and not self.lost
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + self.endpoint.timeout_s
        self._waiting.append((answer, deadline))
        if len(packed) == 1:
            self.transport.write(packed[0])
        else:
            self.transport.writelines(packed)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check_deadline)
        return answer

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self._waiting
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                answer = waiting.popleft()[0]  # IndexError: a reply nobody asked for
                if answer.done():  # its caller gave up (cancelled)
                    continue
                if isinstance(reply, RedisError):
                    answer.set_exception(reply)
                else:
                    answer.set_result(reply)
        except (InvalidResponse, IndexError) as exc:
            self.close(InvalidResponse(f"Protocol error from Redis at {self.endpoint}: {exc!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(ConnectionError(f"Connection to Redis at {self.endpoint} lost: {exc or 'EOF'}"))

    def _check_deadline(self) -> None:
        """The oldest call's deadline passed: fail everything waiting and drop the
        connection (its replies can no longer be matched to calls); else look again at the
        oldest call's deadline."""
        self._timer = None
        if not self._waiting or self.lost:
            return
        loop = asyncio.get_running_loop()
        deadline = self._waiting[0][1]
        if deadline > loop.time():
            self._timer = loop.call_at(deadline, self._check_deadline)
            return
        self.close(RedisTimeout(f"Timeout reading from Redis at {self.endpoint}"))

    def close(self, exc: RedisError) -> None:
        """Close the connection; every call waiting on it fails with ``exc``."""
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()
        waiting, self._waiting = self._waiting, deque()
        for answer, _ in waiting:
            if not answer.done():
                answer.set_exception(exc)


class Lane:
    """A pipelined connection for script calls (see the module docstring).

    >>> from service.storage.store import connect
    >>> lane = Lane.of(connect("redis://:secret@127.0.0.1:7000/2", 0.5))
    >>> str(lane.endpoint), lane.endpoint.timeout_s, lane.endpoint.handshake()
    ('127.0.0.1:7000', 0.5, [('AUTH', 'secret'), ('SELECT', 2)])
    >>> Lane.of(connect("rediss://127.0.0.1:7000/0", 0.5)) is None  # TLS: through redis-py
    True
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    @classmethod
    def of(cls, client: Redis) -> Lane | None:
        """A lane to the server of ``client`` (a single-server client), or None if the lane
        cannot connect as its connections do (TLS, RESP3, a credential provider)."""
        pool = client.connection_pool
        options = pool.connection_kwargs
        kind = pool.connection_class
        if issubclass(kind, SSLConnection) or not issubclass(
            kind, (Connection, UnixDomainSocketConnection)
        ):
            return None
        if options.get("credential_provider") is not None or str(
            options.get("protocol") or 2
        ) not in ("2", "None"):
            return None
        timeout = float(options.get("socket_timeout") or DEFAULT_TIMEOUT_S)
        unix = issubclass(kind, UnixDomainSocketConnection)
        return cls(
            Endpoint(
                host="" if unix else str(options.get("host") or "localhost"),
                port=0 if unix else int(options.get("port") or 6379),
                path=str(options["path"]) if unix else "",
                db=int(options.get("db") or 0),
                username=options.get("username"),
                password=options.get("password"),
                client_name=options.get("client_name"),
                timeout_s=timeout,
                connect_timeout_s=float(options.get("socket_connect_timeout") or timeout),
            )
        )

    async def script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script`` (``EVALSHA``; ``EVAL`` once more if the server does not have it)."""
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted server: EVAL runs it and caches it again
            return await self.call("EVAL", script.script, len(keys), *keys, *args)

    async def call(self, *command: Any) -> Any:
        """Send one command and wait for its reply (see the module docstring)."""
        try:
            packed = pack_command(command)
        except (TypeError, ValueError) as exc:  # as redis-py's packer refuses an argument
            raise DataError(f"invalid argument in {command[0]!r}: {exc}") from None
        protocol = self._protocol
        if protocol is None or protocol.lost:
            protocol = await self._connect()
        return await protocol.call(packed)

    async def _connect(self) -> _Protocol:
        async with self._connecting:
            if self._closed:
                raise ConnectionError("the store is closed")
            if self._protocol is not None and not self._protocol.lost:
                return self._protocol  # another call connected meanwhile
            endpoint = self.endpoint
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(endpoint.connect_timeout_s):
                    if endpoint.path:
                        _, protocol = await loop.create_unix_connection(
                            lambda: _Protocol(endpoint), endpoint.path
                        )
                    else:
                        _, protocol = await loop.create_connection(
                            lambda: _Protocol(endpoint), endpoint.host, endpoint.port
                        )
            except (OSError, TimeoutError) as exc:
                raise ConnectionError(f"Error connecting to Redis at {endpoint}: {exc!r}") from exc
            replies = [protocol.call(pack_command(c)) for c in endpoint.handshake()]
            for outcome in await asyncio.gather(*replies, return_exceptions=True):
                if isinstance(outcome, BaseException):  # e.g. a wrong password: as redis-py
                    protocol.close(ConnectionError(f"handshake with Redis at {endpoint}"))
                    raise outcome
            self._protocol = protocol
            return protocol

    async def aclose(self) -> None:
        """Close the connection (calls still waiting fail); later calls fail at once."""
        self._closed = True
        if self._protocol is not None:
            self._protocol.close(ConnectionError("the store is closed"))
