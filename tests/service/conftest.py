"""Fixtures of the service tests (``redis_url``, ``service`` and ``name`` are every directory's:
``tests/conftest.py``).

* ``launch``: for tests that restart, kill, pause or misconfigure a service: makes
  :class:`~devkit.launcher.ServiceProcess` launchers and closes every one of them when the
  test ends, passed or failed (a bounded stop each: nothing outlives the test).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.service.support import SHARED_ENV, Launch, ServiceProcess


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
