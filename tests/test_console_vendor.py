"""The console's vendored charting library is exactly the recorded npm release: every file's
sha256 matches ``VENDORED.json`` (written by ``scripts/vendor_ui.py``), the release's own
banner names the recorded version, its MIT licence is shipped beside it, and the package data
of ``pyproject.toml`` ships the folder."""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "service" / "api" / "ui" / "vendor" / "uplot"
sys.path.insert(0, str(ROOT / "scripts"))

import vendor_ui  # noqa: E402


def test_vendored_files_match_the_recorded_version_and_hashes() -> None:
    record = json.loads((VENDOR / "VENDORED.json").read_text())
    assert record["package"] == "uplot" and record["license"] == "MIT"
    assert record["integrity"].startswith("sha512-")
    assert set(record["files"]) == set(vendor_ui.FILES.values())
    present = {p.name for p in VENDOR.iterdir()}
    assert present == {*record["files"], "VENDORED.json"}  # nothing unrecorded beside them
    for name, digest in record["files"].items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    banner = (VENDOR / "uPlot.esm.js").read_text()[:400]
    assert f"(v{record['version']})" in banner
    assert "MIT License" in (VENDOR / "LICENSE").read_text()
    assert record["source"].endswith(f"/uplot-{record['version']}.tgz")


def test_the_console_files_are_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["service.api"]
    base = ROOT / "service" / "api"
    shipped = {p for pattern in patterns for p in base.glob(pattern) if p.is_file()}
    everything = {p for p in (base / "ui").rglob("*") if p.is_file()}
    assert everything and shipped == everything


def test_no_console_file_of_ours_names_another_origin() -> None:
    ui = ROOT / "service" / "api" / "ui"
    files = list(ui.glob("*.*"))
    assert {p.name for p in files} >= {"index.html", "app.js", "api.js", "charts.js"}
    for path in files:
        assert "://" not in path.read_text(), path
