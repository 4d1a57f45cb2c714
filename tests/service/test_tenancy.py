"""API keys limited to some models (one key per tenant), over REST and WebSocket, through the
process that learns a model and through one that forwards to it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from service.security import KeyRing, entry_for
from tests.service.support import ROOT, Launch, RedisServer, ServiceProcess, assert_problem

KEYS = {
    "admin": ("adm-tenancy-secret", ["admin"], None),
    "a-admin": ("a-adm-tenancy-secret", ["admin"], ["tenant-a-*"]),
    "a-rw": ("a-rw-tenancy-secret", ["ingest", "query"], ["tenant-a-*", "shared"]),
    "b-rw": ("b-rw-tenancy-secret", ["ingest", "query"], ["tenant-b-*"]),
}
A_MODELS = [f"tenant-a-{k}" for k in range(4)]
B_MODELS = [f"tenant-b-{k}" for k in range(4)]
ALL = [*A_MODELS, *B_MODELS, "shared"]
FAST = {"OPML_LEASE_TTL_S": "3", "OPML_POLL_INTERVAL_S": "0.2", "OPML_LOG_LEVEL": "info"}


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who][0]}"}


@dataclass
class Pair:
    """Two processes on one Redis, and which of them learns each model."""

    procs: list[ServiceProcess]
    owner: dict[str, ServiceProcess]

    def other(self, name: str) -> ServiceProcess:
        return next(p for p in self.procs if p is not self.owner[name])


def _holder(rdb: redis.Redis, name: str) -> str | None:
    raw = rdb.get(f"opml:{{{name}}}:lease")
    return None if raw is None else raw.decode().split(" ", 1)[1]  # type: ignore[union-attr]


def _wait_placed(rdb: redis.Redis, procs: list[ServiceProcess]) -> dict[str, ServiceProcess]:
    """Each model held by one of ``procs`` that serves it itself (bounded wait)."""
    deadline = time.monotonic() + 90
    while True:
        owners: dict[str, ServiceProcess] = {}
        for name in ALL:
            holder = next((p for p in procs if p.url == _holder(rdb, name)), None)
            if holder is None:
                break
            answer = httpx.get(f"{holder.url}/v1/models/{name}", headers=bearer("admin"))
            if answer.status_code != 200 or "x-opml-served-by" in answer.headers:
                break
            owners[name] = holder
        if len(owners) == len(ALL) and len(set(map(id, owners.values()))) == 2:
            return owners
        assert time.monotonic() < deadline, f"models not placed on both processes: {owners}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two keyed processes on a Redis of their own, with tenant models on both."""
    entries = [entry_for(key, scopes, models) for key, scopes, models in KEYS.values()]
    server = RedisServer(tmp_path_factory.mktemp("tenancy-redis")).start()
    procs: list[ServiceProcess] = []
    try:
        for label in ("a", "b"):
            procs.append(
                ServiceProcess(
                    tmp_path_factory.mktemp(f"tenancy-{label}"),
                    server.url,
                    OPML_API_KEYS=json.dumps(entries),
                    **FAST,
                ).start()
            )
        for name in ALL:
            created = httpx.post(
                f"{procs[0].url}/v1/models",
                json={"name": name, "dim": 2},
                headers=bearer("admin"),
                timeout=30,
            )
            assert created.status_code == 201, created.text
        owners = _wait_placed(redis.Redis.from_url(server.url), procs)
        yield Pair(procs, owners)
    finally:
        for proc in procs:
            proc.close()
        server.stop()


# method, path tail (after /v1/models/<name>), JSON body: every kind of model route
MODEL_ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "", None),
    ("DELETE", "", None),
    ("GET", "/metric", None),
    ("PUT", "/metric", {"L": [[1.0, 0.0], [0.0, 1.0]]}),
    ("GET", "/certificate", None),
    ("POST", "/samples", {"x": [1.0, 2.0], "y": "p"}),
    ("POST", "/samples?wait=true", {"x": [1.0, 2.0], "y": "p"}),
    ("POST", "/distance", {"a": [1.0, 2.0], "b": [0.0, 1.0]}),
    ("POST", "/verify", {"a": [1.0, 2.0], "b": [0.0, 1.0]}),
    ("POST", "/transform", {"x": [[1.0, 2.0]]}),
    ("GET", "/gallery", None),
    ("POST", "/gallery", {"items": [{"id": "g1", "x": [1.0, 0.0]}]}),
    ("DELETE", "/gallery/g1", None),
    ("POST", "/identify", {"x": [1.0, 0.0]}),
]


@pytest.mark.parametrize("who", ["a-rw", "a-admin"])
def test_other_tenants_models_answer_403_the_same_whether_they_exist_or_not(
    pair: Pair, who: str
) -> None:
    target = B_MODELS[0]
    for method, tail, body in MODEL_ROUTES:
        answers = []
        for proc in pair.procs:  # the owner of tenant-b-0 and the process that forwards to it
            for name in (target, "tenant-b-absent", "zz-nothing-here"):
                answer = httpx.request(
                    method, f"{proc.url}/v1/models/{name}{tail}", json=body, headers=bearer(who)
                )
                problem = assert_problem(answer, 403)
                # refused before forwarding: answered by the process asked, not by the owner
                assert "x-opml-served-by" not in answer.headers, (method, tail)
                answers.append((problem, answer.headers["www-authenticate"]))
        assert all(a == answers[0] for a in answers), (method, tail, answers)
    # nothing of tenant b's model changed
    state = httpx.get(f"{pair.owner[target].url}/v1/models/{target}", headers=bearer("admin"))
    assert state.status_code == 200 and state.json()["logged_seq"] == 0


def test_own_models_work_through_the_owner_and_through_the_other_process(pair: Pair) -> None:
    name = A_MODELS[0]
    for proc, forwarded in ((pair.owner[name], False), (pair.other(name), True)):
        got = httpx.get(f"{proc.url}/v1/models/{name}", headers=bearer("a-rw"), timeout=30)
        assert got.status_code == 200, got.text
        assert ("x-opml-served-by" in got.headers) is forwarded
        fed = httpx.post(
            f"{proc.url}/v1/models/{name}/samples?wait=true",
            json={"samples": [{"x": [1.0, 0.0], "y": "p"}, {"x": [0.0, 1.0], "y": "q"}]},
            headers=bearer("a-rw"),
            timeout=30,
        )
        assert fed.status_code in (200, 202), fed.text
        distance = httpx.post(
            f"{proc.url}/v1/models/{name}/distance",
            json={"a": [1.0, 0.0], "b": [0.0, 1.0]},
            headers=bearer("a-rw"),
            timeout=30,
        )
        assert distance.status_code == 200, distance.text
    shared = httpx.get(f"{pair.other('shared').url}/v1/models/shared", headers=bearer("a-rw"))
    assert shared.status_code == 200  # an exact name of the key's patterns
    # the scope still counts inside the key's models: a query+ingest key cannot delete
    refused = httpx.delete(f"{pair.owner[name].url}/v1/models/{name}", headers=bearer("a-rw"))
    assert assert_problem(refused, 403)["required_scope"] == "admin"


def test_a_forged_forwarding_header_does_not_skip_the_check(pair: Pair) -> None:
    name = B_MODELS[1]
    for proc in (pair.owner[name], pair.other(name)):
        answer = httpx.get(
            f"{proc.url}/v1/models/{name}/metric",
            headers={**bearer("a-rw"), "x-opml-forwarded-by": pair.other(name).url},
        )
        assert_problem(answer, 403)
    # the owner checks a forwarded request itself: the key it is given is checked again
    unkeyed = httpx.get(
        f"{pair.owner[name].url}/v1/models/{name}",
        headers={"x-opml-forwarded-by": pair.other(name).url},
    )
    assert_problem(unkeyed, 401)


def test_the_list_shows_a_key_only_its_models_from_either_process(pair: Pair) -> None:
    for proc in pair.procs:

        def names(who: str, proc: ServiceProcess = proc) -> list[str]:
            listed = httpx.get(f"{proc.url}/v1/models", headers=bearer(who), timeout=30)
            assert listed.status_code == 200, listed.text
            return sorted(m["name"] for m in listed.json()["models"])

        assert names("a-rw") == sorted([*A_MODELS, "shared"])
        assert names("b-rw") == sorted(B_MODELS)
        assert set(ALL) <= set(names("admin"))  # every model, each from its owner


def test_a_limited_key_creates_only_models_its_patterns_cover(pair: Pair) -> None:
    for proc in pair.procs:
        for name in ("tenant-b-new", B_MODELS[2], "shared"):  # absent, existing, not admin's
            refused = httpx.post(
                f"{proc.url}/v1/models", json={"name": name, "dim": 2}, headers=bearer("a-admin")
            )
            assert_problem(refused, 403)
    assert httpx.get(f"{pair.procs[0].url}/v1/models/tenant-b-new", headers=bearer("admin")
                     ).status_code == 404  # fmt: skip
    made = httpx.post(
        f"{pair.procs[1].url}/v1/models",
        json={"name": "tenant-a-new", "dim": 2},
        headers=bearer("a-admin"),
        timeout=30,
    )
    assert made.status_code == 201, made.text
    gone = httpx.delete(
        f"{pair.procs[0].url}/v1/models/tenant-a-new", headers=bearer("a-admin"), timeout=30
    )
    assert gone.status_code == 204, gone.text


def _ws(url: str, who: str, browser: bool) -> Any:
    key = KEYS[who][0]
    if browser:
        return connect(url, subprotocols=["opml", f"opml.bearer.{key}"], open_timeout=30)  # type: ignore[list-item]
    return connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30)


@pytest.mark.parametrize("browser", [False, True], ids=["header", "subprotocol"])
def test_websocket_streams_respect_the_keys_models(pair: Pair, browser: bool) -> None:
    theirs, mine = B_MODELS[3], A_MODELS[1]
    for proc in pair.procs:
        for name in (theirs, "tenant-b-absent"):
            for route in ("stream", "events"):
                with pytest.raises(InvalidStatus) as refused:
                    _ws(f"{proc.ws_url}/v1/models/{name}/{route}", "a-rw", browser)
                assert refused.value.response.status_code == 403
                assert json.loads(refused.value.response.body)["type"] == "/problems/forbidden"
    for proc in (pair.owner[mine], pair.other(mine)):
        with _ws(f"{proc.ws_url}/v1/models/{mine}/stream", "a-rw", browser) as ws:
            ws.send(json.dumps({"id": "f1", "x": [0.5, 0.5], "y": "p"}))
            assert "ack" in json.loads(ws.recv(timeout=30))
        with _ws(f"{proc.ws_url}/v1/models/{mine}/events?interval_ms=50", "a-rw", browser) as ws:
            assert "version" in json.loads(ws.recv(timeout=30))


def test_bad_model_patterns_stop_the_start_naming_the_setting(
    own_redis: RedisServer, tmp_path: Path, launch: Launch
) -> None:
    digest = "ab" * 32
    for n, patterns in enumerate(("tenant-*-a", "", "Tenant-A*", "a|", "a**")):
        bad = launch(
            tmp_path / f"bad{n}",
            own_redis.url,
            OPML_API_KEYS=json.dumps([f"{digest}:query:{patterns}"]),
        )
        with pytest.raises(RuntimeError, match=r"OPML_API_KEYS\[0\]"):
            bad.start()
        assert digest not in bad.log_path.read_text()


def test_key_tool_makes_limited_entries() -> None:
    made = subprocess.run(
        [sys.executable, "-m", "service.security", "new", "--scopes", "ingest",
         "--models", "tenant-a-*|shared"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = dict(line.split(": ", 1) for line in made.stdout.strip().splitlines())
    assert lines["entry"].strip().endswith(":ingest:tenant-a-*|shared")
    grant = KeyRing.parse([lines["entry"].strip()]).grant_of(lines["key"].strip())
    assert grant is not None and grant.limited
    assert grant.covers("tenant-a-1") and grant.covers("shared") and not grant.covers("x")
    refused = subprocess.run(
        [sys.executable, "-m", "service.security", "new", "--models", "a*b"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode == 2 and "--models" in refused.stderr
