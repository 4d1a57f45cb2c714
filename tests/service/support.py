"""Helpers of the service tests: a real redis-server, the reference learner, Prometheus names.

The service itself is started by :class:`devkit.launcher.ServiceProcess` (re-exported here for
the tests' type hints), through the ``service`` and ``launch`` fixtures of ``conftest.py``.
Nothing here asserts on behalf of a test except :func:`assert_problem`, the shape every error
answer must have, and :func:`assert_equals_core` (with :func:`metric_at`, the read it waits
with), the check of the tests that restart or kill a service: exactly the core's ``L``.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.launcher import ServiceProcess as ServiceProcess  # re-exported for type hints
from service.core import Learner, LearnerConfig
from service.storage.embedded import free_port, redis_server_binary

ROOT = Path(__file__).resolve().parents[2]

#: ``launch(workdir, redis_url, **OPML_settings)`` (the ``launch`` fixture): a launcher, not yet
#: started.
Launch = Callable[..., ServiceProcess]

#: Limits of the shared service (the limit tests rely on them).
SHARED_ENV = {
    "OPML_MAX_DIM": "64",
    "OPML_MAX_BATCH": "500",
    "OPML_MAX_CLASSES": "20",
    "OPML_MAX_BODY_BYTES": "200000",
    "OPML_MIN_VERSION_WAIT_S": "3",  # a read-your-writes wait must not flake on a busy machine
    # A Redis call past this bound is answered 503 (the deployment default is 2 s); on a shared,
    # loaded test machine an AOF fsync (appendfsync always) can stall longer than that.
    "OPML_REDIS_TIMEOUT_S": "10",
    "OPML_CHECKPOINT_EVERY": "64",
    "OPML_MAX_GALLERY": "300",
    # certificate gauges of the models that hold samples out (test_certificates, the alert)
    "OPML_CERTIFICATE_EVERY": "100",
    "OPML_CERTIFICATE_FALSE_ACCEPT_TARGET": "0.05",
}


class RedisServer:
    """A redis-server child process (AOF, appendfsync always) on a fixed port and dir;
    with ``password``, started with ``--requirepass`` (the URL carries it)."""

    def __init__(self, data_dir: Path, port: int | None = None, password: str = "") -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        cmd = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always",
               "--save", "", "--logfile", "redis.log"]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password or None)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.kill()  # not left running behind the error
                    raise
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        """SIGTERM (Redis writes its AOF and exits), SIGKILL if it is not gone in 20 s."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL: no shutdown, only what the AOF (appendfsync always) already holds."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(20)
        self.proc = None


def chromium_flags(profile: Path) -> list[str]:
    """Headless Chromium's flags for the browser tests: a fresh profile in ``profile``, no
    background traffic, and every host but 127.0.0.1 unresolvable, as on a closed network."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def settled(client: httpx.Client, name: str) -> dict[str, Any]:
    """The model body and metric once every logged sample is applied (for before/after)."""
    logged = client.get(f"/v1/models/{name}").json()["logged_seq"]
    metric = metric_at(client, name, logged)
    model = client.get(f"/v1/models/{name}").json()
    for timing in ("checkpoint", "staleness_s"):  # ages change by themselves
        model.pop(timing)
    return {"model": model, "metric": metric}


#: Deadline of a test's wait for a condition: generous, a bound on a busy machine (load far above
#: its cores) and not a timing assertion.
WAIT_S = 120.0


def metric_at(
    client: httpx.Client, name: str, version: int, timeout: float = WAIT_S
) -> dict[str, Any]:
    """``GET /v1/models/{name}/metric?min_version=version``, asked again until it answers.

    The service's own wait for ``min_version`` is bounded (``OPML_MIN_VERSION_WAIT_S``); past
    it the contract is a 503 problem with ``Retry-After``, which a busy machine does meet (the
    learner not yet at ``version``): honoured here, up to ``timeout`` seconds in all. Any other
    answer than 200 or that 503 fails the test at once."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/v1/models/{name}/metric", params={"min_version": version})
        left = deadline - time.monotonic()
        if response.status_code != 503 or left <= 0:
            break
        assert_problem(response, 503)
        time.sleep(min(float(response.headers["retry-after"]), left))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_equals_core(
    client: httpx.Client, name: str, X: np.ndarray, y: list[str], n: int, **config: Any
) -> tuple[dict[str, Any], Learner]:
    """Model ``name``, once at version ``n`` (:func:`metric_at`), has exactly the ``L`` of the
    core learner (``config``) on the first ``n`` samples: the same arithmetic, bit for bit.
    Returns the model's document and that learner, for the caller's own checks."""
    got = metric_at(client, name, n)
    model: dict[str, Any] = client.get(f"/v1/models/{name}").json()
    ref = core_learner(X[:n], y[:n], dim=X.shape[1], **config)
    assert got["version"] == model["version"] == n
    np.testing.assert_array_equal(np.array(got["L"]), ref.L)
    return model, ref


def make_model(client: httpx.Client, name: str, dim: int, **params: Any) -> dict[str, Any]:
    response = client.post("/v1/models", json={"name": name, "dim": dim, **params})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def stream(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """A recorded stream: class-dependent Gaussian blobs (so triplet updates happen)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)) * 2
    labels = rng.integers(classes, size=n)
    X = centers[labels] + rng.normal(size=(n, dim))
    return X, [f"c{k}" for k in labels]


def core_learner(X: np.ndarray, y: list[str], **config: Any) -> Learner:
    """The core learner on the same stream (the reference the service must equal)."""
    learner = Learner(LearnerConfig(**config))
    if len(y):
        learner.learn_many(X, y)
    return learner


def binary(frame_id: Any, X: Any, y: list[Any], header: bytes | None = None) -> bytes:
    """A binary ``/stream`` frame (``header``: a header of the test's own, malformed or not)."""
    head = header if header is not None else json.dumps({"id": frame_id, "y": y}).encode()
    return struct.pack("<I", len(head)) + head + np.asarray(X, dtype="<f8").tobytes()


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem with ``status``; returns its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert {"type", "title", "detail"} <= body.keys()
    assert "Traceback" not in response.text
    return body


# -- Prometheus: the service's exposition, and the metric names dashboards and alerts use ------

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "opml.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

#: PromQL words that look like identifiers but are not metric names.
PROMQL_KEYWORDS = frozenset(
    {
        "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
        "offset", "bool", "inf", "nan",  # and the aggregations, written `sum by (...) (...)`:
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile",
    }
)  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers not inside strings, label matchers,
    range brackets or grouping clauses, that are not functions (``name(``), keywords, numbers,
    durations or Grafana variables (``$model``)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in PROMQL_KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the Grafana dashboard (panel targets, template queries)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:  # Grafana's label_values(selector, label)
        exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", var["definition"]))
    return exprs


def alert_exprs() -> dict[str, str]:
    """Alert name -> expression, from the Prometheus rule file."""
    rules = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def exported_names(exposition: str) -> set[str]:
    """Series names a scrape of ``exposition`` can yield (histograms: _bucket, _sum, _count)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names.update(name + s for s in suffixes)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def scrape(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``GET /metrics`` as {(series name, labels): value}."""
    text = client.get("/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> dict[frozenset[tuple[str, str]], float]:  # fmt: skip
    """The samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lab: v for (n, lab), v in samples.items() if n == name and want <= lab}


def lean_count(client: httpx.Client, route: str) -> float:
    """How many requests of ``route`` (its template) the lean path answered so far."""
    wanted = f'opml_http_lean_requests_total{{route="{route}"}}'
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line + headers, no blank line) and ``body`` over a plain socket,
    whatever its Content-Length claims (httpx refuses to lie); return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        header_blob, _, rest = data.partition(b"\r\n\r\n")
        status_line, *lines = header_blob.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines)}
        while len(rest) < int(headers.get("content-length", 0)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(status_line.split()[1]), headers, rest
