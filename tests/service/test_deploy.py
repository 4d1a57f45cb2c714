"""deploy/ and docker-compose.yml parse and fit together (Docker itself cannot run here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.service.support import DASHBOARD, DEPLOY, ROOT

HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"
CREATE_CLUSTER = DEPLOY / "redis-cluster" / "create-cluster.sh"


def load(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def test_compose_runs_the_service_redis_with_aof_prometheus_and_grafana() -> None:
    compose = load("docker-compose.yml")
    services = {n: s for n, s in compose["services"].items() if "profiles" not in s}
    assert set(services) == {"opml", "redis", "prometheus", "grafana"}  # `docker compose up`
    opml = services["opml"]
    assert opml["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert opml["environment"]["OPML_REDIS_URL"] == "redis://redis:6379/0"
    command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert {"redis-data", "prometheus-data", "grafana-data"} <= set(compose["volumes"])
    for service in compose["services"].values():  # every bind mount exists in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
            else:  # a named volume, declared
                assert source in compose["volumes"], source


def test_prometheus_scrapes_the_compose_service() -> None:
    config = load("deploy/prometheus/prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "opml" and job["static_configs"] == [{"targets": ["opml:8000"]}]
    assert config["rule_files"] == ["alerts.yml"]


def test_grafana_provisions_the_datasource_and_the_dashboard() -> None:
    provisioning = "deploy/grafana/provisioning"
    (datasource,) = load(f"{provisioning}/datasources/prometheus.yml")["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = load(f"{provisioning}/dashboards/opml.yml")["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"  # compose mounts it there
    board = json.loads(DASHBOARD.read_text())
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "model"
    targets = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == datasource["uid"] for p in targets)
    assert all(p["description"] for p in targets)  # every panel says what it shows
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == [
        "Is each model learning?", "Is ingestion keeping up?", "Is verification trustworthy?",
        "Durability",
    ]  # fmt: skip
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), ids  # Grafana tells panels apart by id
    # no two panels share a cell of the 24-column grid (Grafana would push one down)
    cells: dict[tuple[int, int], str] = {}
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]


def test_dockerfile_is_slim_non_root_with_a_livez_healthcheck() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    assert lines[1].startswith("FROM python:") and lines[1].endswith("-slim")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}
    health = [line for line in lines if "/livez" in line]
    assert health and any(line.startswith("HEALTHCHECK") for line in lines)
    assert any(line.startswith("RUN pip install .") for line in lines)


def haproxy_sections(text: str) -> dict[str, list[str]]:
    """``haproxy.cfg`` as {"<keyword> <name>": [its lines]}, comments and blank lines dropped
    (a section starts at an unindented line)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            current = line.strip()
            sections[current] = []
        else:
            sections[current].append(" ".join(line.split()))
    return sections


def test_scale_profile_is_a_redis_cluster_two_service_replicas_and_a_load_balancer() -> None:
    compose = load("docker-compose.yml")
    scale = {n: s for n, s in compose["services"].items() if s.get("profiles") == ["scale"]}
    nodes = {n: s for n, s in scale.items() if n.startswith("redis-node-")}
    replicas = {n: s for n, s in scale.items() if n.startswith("opml-")}
    assert set(scale) == {*nodes, *replicas, "redis-cluster-init", "lb"}
    assert len(nodes) == 6 and len(replicas) >= 2

    for name, node in nodes.items():  # official image, cluster mode, AOF, a volume each
        assert node["image"].startswith("redis:")
        command = " ".join(node["command"])
        assert "--cluster-enabled yes" in command and "--appendonly yes" in command
        assert node["volumes"] == [f"{name}:/data"]

    init = scale["redis-cluster-init"]  # one shot, once every node answers
    assert init["image"].startswith("redis:") and init["restart"] == "no"
    assert init["depends_on"] == {n: {"condition": "service_healthy"} for n in nodes}
    (mount,) = init["volumes"]
    source, target, _ = mount.split(":")
    assert (ROOT / source) == CREATE_CLUSTER and init["entrypoint"] == ["sh", target]
    script = CREATE_CLUSTER.read_text()
    assert "--cluster-replicas 1" in script and "--cluster-yes" in script
    listed = re.search(r'NODES="([^"]*)"', script)
    assert listed is not None and set(listed.group(1).split()) == set(nodes)
    subprocess.run(["sh", "-n", str(CREATE_CLUSTER)], check=True)  # POSIX sh syntax

    for replica in replicas.values():  # each names one node; acks wait for a replica
        env = replica["environment"]
        assert urlsplit(env["OPML_REDIS_URL"]).hostname in nodes
        assert env["OPML_REDIS_WAIT_REPLICAS"] == "1"
        assert replica["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
        assert replica["depends_on"] == {
            "redis-cluster-init": {"condition": "service_completed_successfully"}
        }
    urls = {r["environment"]["OPML_REDIS_URL"] for r in replicas.values()}
    assert len(urls) > 1  # not all through the same node

    lb = scale["lb"]
    assert lb["image"].startswith("haproxy:")
    assert lb["volumes"] == ["./deploy/haproxy:/usr/local/etc/haproxy:ro"]  # the image's path
    assert lb["depends_on"] == {n: {"condition": "service_healthy"} for n in replicas}
    (published,) = lb["ports"]
    sections = haproxy_sections(HAPROXY_CFG.read_text())
    assert f"bind :{published.split(':')[1]}" in sections["frontend api"]
    assert "mode http" in sections["defaults"]  # WebSocket upgrades pass through in HTTP mode
    assert any(line.startswith("timeout tunnel ") for line in sections["defaults"])
    backend = sections["backend opml"]
    assert "option httpchk GET /readyz" in backend and "http-check expect status 200" in backend
    servers = {line.split()[1]: line.split()[2:] for line in backend if line.startswith("server ")}
    assert servers.keys() == replicas.keys()
    for name, args in servers.items():
        assert args[0] == f"{name}:8000" and "check" in args


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy binary not installed")
def test_haproxy_accepts_its_config() -> None:
    checked = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True,
                             text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
