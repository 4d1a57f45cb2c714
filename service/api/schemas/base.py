"""Shared pieces of the wire bodies: name and label rules, the strict body base."""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import CoreSchema

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
MAX_LABEL_CHARS = 128
MAX_ID_CHARS = 256

LABEL_MESSAGE = f"a label is a string of 1-{MAX_LABEL_CHARS} characters or an integer"


class _OneError:
    """Marks a union whose failure is ONE error at the field, with its own message, instead of
    one per member at ``<field>.int``, ``<field>.constrained-str`` (pydantic's default). The
    union stays pydantic-core's: no Python call per value."""

    def __init__(self, error_type: str, message: str) -> None:
        self.error_type, self.message = error_type, message

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        schema = handler(source)
        if schema["type"] != "union":
            raise TypeError(f"_OneError marks a union, not {schema['type']}")
        custom = {"custom_error_type": self.error_type, "custom_error_message": self.message}
        return cast(CoreSchema, {**schema, **custom})


ModelName = Annotated[str, Field(pattern=NAME_PATTERN, examples=["faces"])]
#: A label: a string of 1-128 characters or an integer (an integer means its decimal string).
#: Anything else (a float, a boolean, a list, ``""``, ``null``) is one error at its place:
#: :data:`LABEL_MESSAGE`.
Label = Annotated[
    StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=MAX_LABEL_CHARS)],
    _OneError("label", LABEL_MESSAGE),
    Field(examples=["alice", 3]),
]
#: Numbers only: strict, so ``"2"`` and ``true`` are refused rather than coerced (ints are fine).
Vector = Annotated[list[StrictFloat], Field(min_length=1, examples=[[0.1, 0.2, 0.3]])]
Matrix = Annotated[list[Vector], Field(min_length=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


Rate = Annotated[float, Field(gt=0, lt=0.5, allow_inf_nan=False)]


class OperatingPointTarget(_Body):
    """``{"far": x}`` or ``{"frr": x}``: a target false-accept or false-reject rate."""

    far: Rate | None = None
    frr: Rate | None = None

    @model_validator(mode="after")
    def _one(self) -> OperatingPointTarget:
        if (self.far is None) == (self.frr is None):
            raise ValueError('give exactly one of "far" and "frr"')
        return self


def _one_decision(body: Any) -> None:
    """At most one of ``threshold``, ``far`` and ``frr``."""
    given = [n for n in ("threshold", "far", "frr") if getattr(body, n) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of threshold, far and frr (got {', '.join(given)})")
