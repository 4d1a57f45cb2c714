"""Helpers of the tests that run several service processes on one Redis: quick leases, where
each model is held, and a bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from service.engine.membership import rendezvous
from tests.service.support import ServiceProcess

#: Leases of 3 s renewed every second, checkpoints every 100 samples or 1 s after a change.
FAST = {
    "OPML_LEASE_TTL_S": "3",
    "OPML_POLL_INTERVAL_S": "0.2",
    "OPML_CHECKPOINT_EVERY": "100",
    "OPML_CHECKPOINT_INTERVAL_S": "1",
    "OPML_LOG_LEVEL": "info",
}


def eventually(what: Callable[[], Any], timeout: float = 60) -> Any:
    """Poll ``what`` until it returns something truthy (a bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return value


def member(svc: ServiceProcess) -> str:
    return svc.url  # a process's member id is its advertised URL


def lease_holder(rdb: redis.Redis, name: str) -> str | None:
    raw = rdb.get(f"opml:{{{name}}}:lease")
    return None if raw is None else raw.decode().split(" ", 1)[1]  # type: ignore[union-attr]


def placed(rdb: redis.Redis, procs: list[ServiceProcess], names: list[str]) -> bool:
    """Every model is held by the process rendezvous hashing gives it among ``procs``, and
    that process serves it (its document answers without forwarding)."""
    ids = sorted(member(p) for p in procs)
    for name in names:
        owner = rendezvous(name, ids)
        if lease_holder(rdb, name) != owner:
            return False
        svc = next(p for p in procs if member(p) == owner)
        answer = httpx.get(f"{svc.url}/v1/models/{name}", timeout=10)
        if answer.status_code != 200 or "x-opml-served-by" in answer.headers:
            return False
    return True
