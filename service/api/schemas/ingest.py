"""Ingestion bodies and answers: samples, batches, stream frames, acknowledgements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Protocol

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from service.api.schemas.base import (
    Label,
    Vector,
    _Body,
)

HoldoutFlag = Annotated[
    StrictBool,
    Field(description="True: route the sample to the certification reservoir (never learned)."),
]


class SampleFields(Protocol):
    """A sample's fields as validated: a :class:`Sample` of a batch, or the single-sample
    body itself (its ``holdout`` None when absent)."""

    @property
    def x(self) -> list[float]: ...
    @property
    def y(self) -> Any: ...
    @property
    def holdout(self) -> bool | None: ...


class Sample(_Body):
    x: Vector
    y: Label
    holdout: HoldoutFlag = False


class IngestBody(_Body):
    """Either one sample ``{x, y, holdout?}`` or a batch ``{samples: [...]}`` (applied in list
    order).

    ``x`` and ``y`` may be absent (the batch form), not ``null``: a ``null`` is validated like
    any other value and refused at its field (their type has no ``None``; the default is not
    validated)."""

    x: Vector = None  # type: ignore[assignment]
    y: Label = None  # type: ignore[assignment]
    holdout: HoldoutFlag | None = None
    samples: list[Sample] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> IngestBody:
        single = self.x is not None or self.y is not None
        if single == (self.samples is not None):
            raise ValueError("send either {x, y} or {samples: [...]}")
        if single and (self.x is None or self.y is None):
            raise ValueError("a single sample needs both x and y")
        if not single and self.holdout is not None:
            raise ValueError("in a batch, holdout is a field of each sample")
        return self

    def located(self, loc: list[str | int]) -> tuple[Sequence[SampleFields], list[str | int], bool]:
        """The samples of this body found at ``loc`` in the request, where they are and
        whether they are a list (each sample adds its index to ``loc``): the batch under
        ``samples``, or this body itself as the one sample (its fields are validated already,
        as this body's: no :class:`Sample` is made of them)."""
        if self.samples is not None:
            return self.samples, [*loc, "samples"], True
        assert self.x is not None and self.y is not None
        return (self,), loc, False


FrameId = StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=256)]


class StreamFrame(IngestBody):
    """A client frame of ``WS /v1/models/{name}/stream``."""

    id: FrameId


class BinaryHeader(_Body):
    """The JSON header of a binary ``/stream`` frame; the float64 block after it holds one
    row of ``dim`` values per label."""

    id: FrameId
    y: list[Label] = Field(min_length=1)
    holdout: list[StrictBool] | None = Field(
        default=None, description="One flag per label: true routes it to the reservoir."
    )

    @model_validator(mode="after")
    def _one_flag_per_label(self) -> BinaryHeader:
        if self.holdout is not None and len(self.holdout) != len(self.y):
            raise ValueError(f"holdout: expected {len(self.y)} flags (one per label)")
        return self


class Accepted(BaseModel):
    accepted: int
    first_seq: int
    last_seq: int


class StepOut(BaseModel):
    seq: int
    outcome: str = Field(
        description="new_class, pair_update, triplet_update, shrunk_update, passive, "
        "single_class, skipped, or held_out (routed to the certification reservoir: not "
        "learned; hinge and distances null)."
    )
    hinge: float | None
    d_pos: float | None
    d_neg: float | None
    gamma: float | None = Field(default=None, description="Step size used (null: L unchanged).")


class Applied(Accepted):
    """``?wait=true``: the samples are applied; ``results`` is null only for a replay whose
    per-sample results are no longer kept."""

    version: int
    results: list[StepOut] | None
