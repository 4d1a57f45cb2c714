"""Operating points from the SDK and the command line: ``verify`` / ``identify`` with ``far`` /
``frr``, ``roc`` (JSON, CSV, the table and ``--out``) and their refusals."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from clients import OPMLClient
from clients.errors import Conflict
from tests.clients.support import opml
from tests.service.support import ServiceProcess, stream


def test_sdk_and_cli_by_target_rate(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    X, y = stream(2400, 3, 3, seed=31)
    client.create_model(name, 3, gamma=0.01, holdout=0.3, holdout_window=3000)
    with pytest.raises(Conflict) as refused:  # nothing held out yet
        client.verify(name, X[0], X[1], far=0.01)
    assert "holdout" in str(refused.value.extra.get("hint"))
    for lo in range(0, 2400, 400):
        client.ingest(name, X[lo : lo + 400], y[lo : lo + 400], wait=True)
    v = client.verify(name, X[0], X[1], far=0.05, min_version=2400)
    assert v.threshold_source == "far" and v.operating_point is not None
    assert v.operating_point["far_bound"] == 0.05 and v.threshold == v.operating_point["threshold"]

    a, b = (",".join(map(repr, row.tolist())) for row in X[:2])
    done = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--far", "0.05", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["operating_point"] == v.operating_point
    said = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--far", "0.05").stdout
    assert f"false accept rate <= {v.operating_point['far_bound']:.4g}" in said
    both = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--far", "0.1", "--frr", "0.1")
    assert both.returncode == 2  # usage: one of --threshold, --far, --frr
    out_of_range = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--far", "0.7")
    assert out_of_range.returncode == 5 and "far" in out_of_range.stderr
    too_strict = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--far", "0.0001")
    assert too_strict.returncode == 4 and "more held-out samples" in too_strict.stderr

    client.enroll(name, ["p", "q"], X[:2], y[:2])
    found = client.identify(name, [1e3, 1e3, 1e3], k=2, frr=0.1)
    assert found.unknown and found.threshold_source == "frr"
    many = client.identify_many(name, [X[0], X[1]], k=1, far=0.05)
    assert many.threshold_source == "far" and [r[0].id for r in many.results] == ["p", "q"]
    # the binary form (an .npz body and answer) decides the same, and says so
    rows = np.array([X[0], [1e3, 1e3, 1e3]])
    npz = client.identify_many(name, rows, k=1, far=0.05, binary=True)
    as_json = client.identify_many(name, rows, k=1, far=0.05, binary=False)
    assert npz.operating_point == as_json.operating_point and npz.operating_point is not None
    assert npz.unknown == as_json.unknown == [False, True]
    assert npz.threshold == as_json.threshold and npz.threshold_source == "far"

    curve = client.roc(name, points=9)
    assert len(curve["points"]) == 9 and curve["version"] == 2400
    text = client.roc(name, points=9, csv=True)
    assert len(list(csv.DictReader(io.StringIO(text)))) == 9
    out = tmp_path / "roc.csv"
    table = opml(service, "roc", name, "--points", "9", "--out", str(out))
    assert table.returncode == 0, table.stderr
    assert out.read_text() == text
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["threshold", "far", "far<="] and len(lines) == 1 + 9 + 2
    first = curve["points"][0]
    assert lines[1].split()[0] == f"{first['threshold']:.6g}"

    created = opml(service, "models", "create", f"{name}-op", "--dim", "3", "--holdout", "0.2",
                   "--operating-point", "far=0.01", "--json")  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["operating_point"] == {"far": 0.01}
    assert json.loads(created.stdout)["holdout"] == 0.2
    bad = opml(
        service, "models", "create", f"{name}-bad", "--dim", "3", "--operating-point", "tar=1"
    )
    assert bad.returncode == 2
