"""Refresh the console's vendored charting library (uPlot) from the npm registry.

    python scripts/vendor_ui.py            # the version recorded in VENDORED.json
    python scripts/vendor_ui.py 1.6.32     # another version

``npm pack`` fetches the package tarball and checks it against the registry's integrity hash;
this script copies the ES module build, its stylesheet and the licence into
``service/api/ui/vendor/uplot/`` and records the version, the tarball's integrity string and
each file's sha256 in ``VENDORED.json`` (``tests/service/test_console_vendor.py`` checks the
files against it). Needs ``npm`` (Node.js) on PATH; the service itself never needs Node.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "uplot"
#: Files taken from the package (path inside the tarball -> name in the vendor folder).
FILES = {
    "package/dist/uPlot.esm.js": "uPlot.esm.js",
    "package/dist/uPlot.min.css": "uPlot.min.css",
    "package/LICENSE": "LICENSE",
}
TARGET = Path(__file__).resolve().parents[1] / "service" / "api" / "ui" / "vendor" / "uplot"
RECORD = TARGET / "VENDORED.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def vendor(version: str) -> dict[str, object]:
    """Fetch ``uplot@version`` with npm, copy :data:`FILES`, write and return the record."""
    with tempfile.TemporaryDirectory() as tmp:
        packed = subprocess.run(
            ["npm", "pack", f"{PACKAGE}@{version}", "--json", "--pack-destination", tmp],
            check=True,
            capture_output=True,
            text=True,
        )
        info = json.loads(packed.stdout)[0]
        with tarfile.open(Path(tmp) / info["filename"]) as tar:
            TARGET.mkdir(parents=True, exist_ok=True)
            for inner, name in FILES.items():
                member = tar.extractfile(inner)
                if member is None:
                    raise SystemExit(f"{inner} is not a file in {info['filename']}")
                (TARGET / name).write_bytes(member.read())
    record: dict[str, object] = {
        "package": PACKAGE,
        "version": info["version"],
        "license": "MIT",
        "source": f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{info['version']}.tgz",
        "integrity": info["integrity"],
        "files": {name: sha256(TARGET / name) for name in FILES.values()},
    }
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str]) -> int:
    version = argv[0] if argv else json.loads(RECORD.read_text())["version"]
    record = vendor(version)
    print(f"vendored {PACKAGE} {record['version']} into {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
