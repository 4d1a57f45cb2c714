"""The checkpoint record (``service/storage/checkpoint.py``), without Redis: a learner encoded to
its hash fields and decoded back resumes bit-identically."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.storage import checkpoint
from service.storage.codec import DTYPE
from tests.service.support import stream


@pytest.mark.parametrize("algorithm", ["opml", "copml"])
def test_a_decoded_checkpoint_resumes_bit_identically(algorithm: str) -> None:
    X, y = stream(600, 6, 4, seed=11)
    config = LearnerConfig(dim=6, algorithm=algorithm, gamma=0.01, seed=5)
    straight = Learner(config)
    straight.learn_many(X, y)

    first = Learner(config)
    first.learn_many(X[:350], y[:350])
    ckpt, buffer = checkpoint.encode(first, applied=(350, 1), metric_puts=2, time=12.5)
    assert all(isinstance(v, bytes) for v in (*ckpt.values(), *buffer.values()))
    assert set(buffer) == set(first.classes)
    restored = checkpoint.decode(ckpt, buffer, dim=6)
    assert (restored.seq, restored.applied, restored.metric_puts, restored.time) == (
        350,
        (350, 1),
        2,
        12.5,
    )
    restored.learner.learn_many(X[350:], y[350:])
    np.testing.assert_array_equal(restored.learner.L, straight.L)
    assert restored.learner.counts == straight.counts
    assert restored.learner.calibrator.calibration() == straight.calibrator.calibration()


def test_arrays_are_stored_as_little_endian_float64() -> None:
    learner = Learner(LearnerConfig(dim=2))
    ckpt, _ = checkpoint.encode(learner, applied=(0, 0), metric_puts=0, time=0.0)
    assert np.frombuffer(ckpt["L"], dtype=DTYPE).tolist() == [1.0, 0.0, 0.0, 1.0]
    assert json.loads(ckpt["meta"])["dtype"] == "<f8"


def test_an_inconsistent_record_is_refused() -> None:
    learner = Learner(LearnerConfig(dim=2))
    learner.learn_many([[0.0, 1.0], [1.0, 0.0]], ["a", "b"])
    ckpt, buffer = checkpoint.encode(learner, applied=(2, 1), metric_puts=0, time=0.0)
    del buffer["b"]
    with pytest.raises(ValueError, match="no row for class 'b'"):
        checkpoint.decode(ckpt, buffer, dim=2)
    _, good = checkpoint.encode(learner, applied=(2, 1), metric_puts=0, time=0.0)
    with pytest.raises(ValueError, match="stored array"):
        checkpoint.decode(ckpt, {**good, "b": b"\x00" * 3}, dim=2)
