"""The blocking client is generated from the asyncio one (``scripts/unasync.py``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unasync(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "unasync.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_committed_sync_client_is_the_generated_one() -> None:
    done = unasync(ROOT, "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_fails_on_drift_either_way(tmp_path: Path) -> None:
    """An edit of the generated file, or of the source without regenerating, fails the check
    with a diff; regenerating makes it pass again."""
    for part in ("clients", "scripts", "pyproject.toml"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(ROOT / part, tmp_path / part)
    sync, aio = tmp_path / "clients" / "sync.py", tmp_path / "clients" / "aio.py"

    sync.write_text(sync.read_text().replace("time.sleep(self.retry.delay", "time.sleep(0 * ("))
    edited = unasync(tmp_path, "--check")
    assert edited.returncode == 1 and "+++ clients/sync.py (generated" in edited.stdout
    assert "-            time.sleep(0 * (" in edited.stdout

    assert unasync(tmp_path).returncode == 0
    drain = (
        "        with contextlib.suppress(TimeoutError):  # collect acks already there, keep"
        " progress live\n"
        "            while self._window.pending:\n"
        "                await self._receive(0)\n"
    )
    assert drain in aio.read_text()
    aio.write_text(aio.read_text().replace(drain, ""))  # the drift this script ended
    drifted = unasync(tmp_path, "--check")
    assert drifted.returncode == 1 and "-                self._receive(0)" in drifted.stdout
    assert unasync(tmp_path).returncode == 0
    assert unasync(tmp_path, "--check").returncode == 0


def test_a_changed_special_block_is_refused(tmp_path: Path) -> None:
    """The one block whose blocking form has another shape must match exactly, so changing it
    in aio.py without updating the script cannot produce a wrong sync.py silently."""
    shutil.copytree(ROOT / "clients", tmp_path / "clients")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    aio = tmp_path / "clients" / "aio.py"
    aio.write_text(aio.read_text().replace("return await ws.recv()", "return await ws.recv(None)"))
    done = unasync(tmp_path, "--check")
    assert done.returncode != 0 and "matches 0 times" in done.stderr
