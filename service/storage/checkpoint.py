"""The checkpoint record, end to end: a learner's state <-> the Redis fields that hold it.

Pure functions (no Redis call): :func:`encode` turns a :class:`~service.core.Learner` and its log
position into the fields of the model's ``ckpt`` hash and ``buffer`` hash; :func:`decode` turns
the fields read back into a learner that resumes bit-identically. :mod:`service.storage.logstore`
writes and reads the fields atomically (one Lua script each way) and nothing else.

``ckpt`` hash fields:

* ``meta``: JSON ``{"learner": <Learner.to_state() metadata>, "seq", "applied": [ms, part],
  "metric_puts", "time", "dtype", "arrays": {name: shape}}``;
* one field per array of ``Learner.to_state()`` except the buffer (``L``, ``calibration``, and
  whatever else a learner keeps), raw :data:`~service.storage.codec.DTYPE` bytes, their shapes
  in ``meta.arrays``;
* ``applied`` (the log position, ``"<ms>-<part>"``) and ``time`` as plain fields, so other
  processes read them cheaply with the log tail.

``buffer`` hash: class key -> that class's latest sample (the buffer H), raw bytes.

>>> from service.core import Learner, LearnerConfig
>>> learner = Learner(LearnerConfig(dim=2))
>>> _ = learner.learn_many([[0.0, 1.0], [1.0, 0.0], [0.0, 0.9]], ["a", "b", "a"])
>>> ckpt, buffer = encode(learner, applied=(3, 1), metric_puts=0, time=1.5)
>>> sorted(buffer), ckpt["applied"]
(['a', 'b'], b'3-1')
>>> restored = decode(ckpt, buffer, dim=2)
>>> restored.seq, restored.applied, (restored.learner.L == learner.L).all()
(3, (3, 1), np.True_)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core import Learner
from service.storage.codec import DTYPE, StreamId, decode_vector, encode_vector, format_id

#: The field of the ``ckpt`` hash that holds the JSON metadata.
META = "meta"


@dataclass(frozen=True)
class Restored:
    """A checkpoint read back: the learner, the last seq and log position it covers, the
    number of metric replacements applied, and when it was written (epoch seconds)."""

    learner: Learner
    seq: int
    applied: StreamId
    metric_puts: int
    time: float


def encode(
    learner: Learner, *, applied: StreamId, metric_puts: int, time: float
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The ``ckpt`` and ``buffer`` hash fields of ``learner`` as of log position ``applied``."""
    arrays, learner_meta = learner.to_state()
    buffer_rows = arrays.pop("buffer")
    meta = {
        "learner": learner_meta,
        "seq": learner.version,
        "applied": list(applied),
        "metric_puts": metric_puts,
        "time": time,
        "dtype": DTYPE.str,
        "arrays": {name: list(np.shape(a)) for name, a in arrays.items()},
    }
    ckpt = {name: encode_vector(a) for name, a in arrays.items()}
    ckpt[META] = json.dumps(meta).encode()
    ckpt["applied"] = format_id(applied).encode()
    ckpt["time"] = repr(time).encode()
    buffer = {
        label: encode_vector(row)
        for label, row in zip(learner_meta["classes"], buffer_rows, strict=True)
    }
    return ckpt, buffer


def decode(ckpt: dict[str, bytes], buffer: dict[str, bytes], dim: int) -> Restored:
    """The learner and position of a checkpoint (ValueError if the fields are inconsistent)."""
    meta: dict[str, Any] = json.loads(ckpt[META])
    shapes: dict[str, list[int]] = meta["arrays"]
    arrays = {}
    for name, shape in shapes.items():
        raw = ckpt[name]
        flat = np.frombuffer(raw, dtype=DTYPE).astype(np.float64)
        arrays[name] = flat.reshape(shape)
    classes = meta["learner"]["classes"]
    missing = [c for c in classes if c not in buffer]
    if missing:
        raise ValueError(f"checkpoint: the buffer has no row for class {missing[0]!r}")
    rows = [decode_vector(buffer[c], dim) for c in classes]
    arrays["buffer"] = np.array(rows).reshape(len(rows), dim)
    learner = Learner.from_state(arrays, meta["learner"])
    return Restored(
        learner=learner,
        seq=int(meta["seq"]),
        applied=(int(meta["applied"][0]), int(meta["applied"][1])),
        metric_puts=int(meta["metric_puts"]),
        time=float(meta["time"]),
    )
