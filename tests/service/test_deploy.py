"""deploy/ and docker-compose.yml parse and fit together (Docker itself cannot run here)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.service.support import DASHBOARD, DEPLOY, ROOT


def load(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def test_compose_runs_the_service_redis_with_aof_prometheus_and_grafana() -> None:
    compose = load("docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"opml", "redis", "prometheus", "grafana"}
    opml = services["opml"]
    assert opml["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert opml["environment"]["OPML_REDIS_URL"] == "redis://redis:6379/0"
    command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert set(compose["volumes"]) == {"redis-data", "prometheus-data", "grafana-data"}
    for service in services.values():  # every bind mount exists in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).is_dir(), source


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


def test_dockerfile_is_slim_non_root_with_a_livez_healthcheck() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    assert lines[1].startswith("FROM python:") and lines[1].endswith("-slim")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}
    health = [line for line in lines if "/livez" in line]
    assert health and any(line.startswith("HEALTHCHECK") for line in lines)
    assert any(line.startswith("RUN pip install .") for line in lines)
