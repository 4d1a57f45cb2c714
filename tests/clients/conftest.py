"""Fixtures of the SDK/CLI tests (the shared Redis and service: ``tests/conftest.py``): an SDK
client on the service and a :class:`~tests.clients.support.CuttableProxy` in front of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clients import OPMLClient
from tests.clients.support import FAST_RETRY, CuttableProxy
from tests.service.support import ServiceProcess


@pytest.fixture
def client(service: ServiceProcess) -> Iterator[OPMLClient]:
    with OPMLClient(service.url, retry=FAST_RETRY) as c:
        yield c


@pytest.fixture
def proxy(service: ServiceProcess) -> Iterator[CuttableProxy]:
    p = CuttableProxy(service.port)
    yield p
    p.close()
