"""The generated reference pages name every setting, metric family and problem type, checked
against sources independent of the generator: the service's own ``--help``, the families a live
service exports on ``/metrics``, and the problem types the code raises. And the docs site
builds offline with ``--strict`` (broken links, missing pages and API objects fail it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devkit.launcher import ServiceProcess
from tests.service.support import ROOT

_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
assert _spec is not None and _spec.loader is not None
gen_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_reference)


def test_every_setting_of_the_command_line_is_in_the_reference() -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    variables = set(re.findall(r"\((OPML_[A-Z_]+);", helped))
    assert len(variables) > 30
    page = gen_reference.settings_page()
    assert {v for v in variables if f"`{v}`" not in page} == set()


def test_every_exported_family_is_in_the_reference(tmp_path: Path) -> None:
    """A live service with a model that learned, holds samples out and was certified: the
    families it exports (``# HELP``) are all in the metrics page."""
    settings = {"OPML_CERTIFICATE_EVERY": "1", "OPML_CERTIFICATE_FALSE_ACCEPT_TARGET": "0.1"}
    with ServiceProcess(tmp_path, **settings) as svc, svc.client() as api:
        api.post("/v1/models", json={"name": "m", "dim": 2, "holdout": 0.5}).raise_for_status()
        samples = [{"x": [i % 3, (i * 7) % 5], "y": i % 3} for i in range(60)]
        api.post("/v1/models/m/samples?wait=true", json={"samples": samples}).raise_for_status()
        api.post("/v1/models/m/verify", json={"a": [0, 1], "b": [1, 0]}).raise_for_status()
        exported = httpx.get(svc.url + "/metrics").text
    families = set(re.findall(r"^# HELP (opml_\w+) ", exported, re.MULTILINE))
    assert "opml_steps" in families or "opml_steps_total" in families
    page = gen_reference.metrics_page()
    missing = {f for f in families if f"`{f}`" not in page and f"`{f}_total`" not in page}
    assert missing == set()


def test_every_problem_type_the_code_raises_is_in_the_reference() -> None:
    """Slugs of every ``ServiceError`` subclass and every ``/problems/<slug>`` in the code."""
    from service import errors

    slugs = {
        cls.slug
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.ServiceError)
    }
    for path in (ROOT / "service").rglob("*.py"):
        slugs |= set(re.findall(r"/problems/([a-z][a-z-]+)", path.read_text()))
    page = gen_reference.problems_page()
    assert {s for s in slugs if f"`/problems/{s}`" not in page} == set()


def test_the_http_reference_has_every_operation() -> None:
    from service.app import create_app
    from service.config import Settings

    page = gen_reference.http_page()
    for path, operations in create_app(Settings()).openapi()["paths"].items():
        for method in operations:
            assert f"## `{method.upper()} {path}`" in page


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="the docs extra is not installed (python3 dev.py docs installs it)",
)
def test_the_site_builds_offline_and_strict(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py")], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    pages = list(tmp_path.rglob("*.html"))
    assert len(pages) > 30
    for page in pages:
        text = page.read_text()
        assert "fonts.googleapis" not in text
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", text), page
