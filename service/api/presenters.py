"""How the engine's read models are shown on the wire: the model document, the ``/events``
frame, the verification summary, the threshold a ``verify`` uses, and the JSON answers of the
hot paths (:func:`json_response`).

Both documents are made from one :class:`~service.engine.status.ModelStatus` (one snapshot), so
the model document, ``/events`` and the Prometheus collector (:mod:`service.api.observe`) show
the same numbers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from service.core.calibration import MIN_PAIRS, served_threshold
from service.engine.snapshot import Snapshot
from service.engine.status import ModelStatus


def updates(counts: dict[str, int]) -> dict[str, int]:
    """Steps by outcome as the contract names them (``triplet`` includes ``shrunk``)."""
    return {
        "triplet": counts["triplet_update"] + counts["shrunk_update"],
        "shrunk": counts["shrunk_update"],
        "pair": counts["pair_update"],
        "passive": counts["passive"],
        "new_class": counts["new_class"],
        "single_class": counts["single_class"],
        "skipped": counts["skipped"],
        "held_out": counts["held_out"],
        "gradient": counts["sgd_update"],
    }


def verification(snap: Snapshot) -> dict[str, Any]:
    """The calibration window's verdict."""
    cal = snap.calibration
    return {
        "threshold": cal.threshold,
        "calibrated": cal.calibrated,
        "eer": cal.eer,
        "accuracy": cal.accuracy,
        "pairs": cal.pairs,
        "min_pairs": MIN_PAIRS,
    }


def _live(snap: Snapshot) -> dict[str, Any]:
    """What the model document and ``/events`` frames both say about the live state."""
    return {
        "version": snap.version,
        "samples_seen": snap.version,
        "classes": snap.classes,
        "updates": updates(snap.counts),
        "verification": verification(snap),
        "metric_puts": snap.metric_puts,
        "health": snap.health,
    }


def model_document(status: ModelStatus) -> dict[str, Any]:
    """The Model document of the contract (``ModelOut``)."""
    snap = status.snapshot
    c = status.config
    return {
        "name": status.name,
        "dim": c.dim,
        "algorithm": c.algorithm,
        "step": c.step,
        "gamma": c.gamma,
        "gamma_pair": c.gamma_pair,
        "margin": c.margin,
        "normalize": c.normalize,
        "seed": c.seed,
        "calibration_window": c.calibration_window,
        "auto_warmup": c.auto_warmup,
        "rehearsal": c.rehearsal,
        "rehearsal_memory": c.rehearsal_memory,
        "precondition": c.precondition,
        "refresh": c.refresh,
        "shrinkage": c.shrinkage,
        "holdout": c.holdout,
        "holdout_window": c.holdout_window,
        "pac_bayes_prefix": c.pac_bayes_prefix,
        "pac_bayes_window": c.pac_bayes_window,
        "operating_point": c.operating_point,
        "eta": c.eta,
        "mu": c.mu,
        "kappa": c.kappa,
        "lam": c.lam,
        **_live(snap),
        "stability": snap.stability.to_dict(),
        "race": snap.race,
        "effective": snap.effective,
        "logged_seq": status.logged_seq,
        "checkpoint": {
            "seq": status.checkpoint_seq,
            "age_s": None
            if status.checkpoint_at is None
            else max(0.0, time.time() - status.checkpoint_at),
        },
        "created_at": status.created_at,
        "owner": status.owner,
        "fencing_token": status.fencing_token,
        "staleness_s": status.staleness_s,
    }


def event_frame(status: ModelStatus) -> dict[str, Any]:
    """One ``/events`` frame (``dropped`` is added when it is sent)."""
    return {**_live(status.snapshot), "time": time.time()}


def verify_threshold(snap: Snapshot, given: float | None) -> tuple[float, str]:
    """The threshold a verify uses and where it came from: the core's rule (the one
    certificates certify by default, :func:`service.core.calibration.served_threshold`; its
    margin fallback in input units, :attr:`service.core.Learner.margin`)."""
    return served_threshold(snap.calibration, snap.margin, given)


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def json_response(
    content: dict[str, Any],
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    encoded: Mapping[str, str] | None = None,
) -> Response:
    """A plain JSON answer: no pydantic re-validation of what the service computed itself
    (large matrices, per-request answers); NaN or Inf cannot slip through (``allow_nan=False``).
    ``encoded``: members whose values are JSON text already (encoded once, cached), appended.

    >>> json_response({"accepted": 1}, 202).body
    b'{"accepted":1}'
    >>> json_response({"a": 1}, encoded={"b": '{"c":[2]}'}).body
    b'{"a":1,"b":{"c":[2]}}'
    """
    text = _ENCODER.encode(content)
    if encoded:
        more = ",".join(f"{_ENCODER.encode(k)}:{v}" for k, v in encoded.items())
        text = f"{text[:-1]},{more}}}" if content else f"{{{more}}}"
    return Response(text, status_code, headers, media_type="application/json")
