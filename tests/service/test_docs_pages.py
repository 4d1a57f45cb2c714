"""``/docs`` and ``/redoc`` render in a real browser with no network but the service's own:
headless Chromium (Debian's, installed by ``.ci/run``) with every other host unresolvable, as
on a closed network. The rendered DOM must show the operations, not a blank page."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.service.support import ServiceProcess, chromium_flags

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (.ci/run installs Debian's chromium when run as root)",
)


def rendered(url: str, profile: Path) -> str:
    """The DOM of ``url`` once its scripts ran, every host but 127.0.0.1 unresolvable."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            *chromium_flags(profile),
            "--virtual-time-budget=15000",  # let the page fetch /openapi.json and render it
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize(
    ("page", "shows"),
    [
        ("/docs", ['id="operations-models-create_model"', 'id="operations-queries-verify"']),
        ("/redoc", ['id="operation/create_model"', "Create a model; 409 if the name exists."]),
    ],
)
def test_the_docs_pages_render_the_operations_offline(
    service: ServiceProcess, tmp_path: Path, page: str, shows: list[str]
) -> None:
    html = httpx.get(service.url + page, timeout=10).text
    external = re.findall(r"""(?:src|href)=["']((?:https?:)?//[^"']+)""", html)
    assert external == []  # scripts, styles, fonts and icon all come from the service
    dom = rendered(service.url + page, tmp_path / "profile")
    for text in shows:
        assert text in dom, (page, text, dom[-3000:])
