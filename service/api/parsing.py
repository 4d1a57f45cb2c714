"""The one place where request bytes and values become what the engine and the core trust.

* Bodies: :func:`json_body` (every JSON body of the API, through pydantic's one-pass
  ``model_validate_json``), :func:`~service.api.npy.npz_arrays` (the binary bodies),
  :func:`distance_body` and
  :func:`identify_body` (JSON or ``.npz`` each). Query parameters and headers:
  :func:`min_version`, :func:`restricted`, :func:`ingest_options` (``?wait`` and
  ``Idempotency-Key``), :func:`wait`. A model's configuration: :func:`learner_config`. The
  FastAPI routes and the lean path (:mod:`service.api.lean`) both call these, so they cannot
  disagree.
* Values: shapes and finiteness are checked by the core's validators
  (:mod:`service.core._validation`); their ``ValueError`` becomes a 422 problem whose
  ``errors`` item points at the bad field (``loc``).

The ``.npz`` / ``.npy`` formats themselves (reading an archive safely, writing arrays) are
:mod:`service.api.npy`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import BaseModel, StringConstraints, TypeAdapter, ValidationError

from service.api.npy import NPZ, npz_arrays
from service.api.schemas import (
    MAX_ID_CHARS,
    MAX_LABEL_CHARS,
    DistanceBody,
    GalleryItem,
    IdentifyBody,
    ModelCreate,
    SampleFields,
)
from service.core import LearnerConfig
from service.core._validation import (
    Array,
    check_matrix,
    check_metric,
    check_vector,
    label_key,
    plain_keys,
)
from service.core.certificates import Method, check_certificate_args
from service.core.holdout import Flags
from service.errors import InvalidInput, UnsupportedMediaType

T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)

JSON = "application/json"


def invalid(loc: list[str | int], msg: str) -> InvalidInput:
    """A 422 for the field at ``loc``."""
    return invalid_request([{"loc": loc, "msg": msg, "type": "value_error"}])


def invalid_request(items: list[dict[str, Any]]) -> InvalidInput:
    """The 422 of a list of ``{loc, msg, type}`` items; its detail names the first one."""
    first = items[0] if items else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return InvalidInput(f"{where}: {first['msg']}" if where else str(first["msg"]), items)


def error_items(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """pydantic's errors as ``{loc, msg, type}`` items (no input echo, no "Value error, "
    prefix), under ``prefix``.

    >>> from service.api.schemas import Sample
    >>> try:
    ...     Sample.model_validate_json('{"x": [1], "y": 1.5}')
    ... except ValidationError as exc:
    ...     error_items(exc, ("body",))
    [{'loc': ['body', 'y'], 'msg': 'a label is a string of 1-128 characters or an integer', \
'type': 'label'}]
    """
    return [
        {
            "loc": [*prefix, *e["loc"]],
            "msg": e["msg"].removeprefix("Value error, "),
            "type": e["type"],
        }
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


# -- bodies and query parameters --------------------------------------------------------------


def media_type(content_type: str | None) -> str:
    """``type/subtype`` of a ``Content-Type`` header, lower case ('' when absent).

    >>> media_type("Application/JSON; charset=utf-8")
    'application/json'
    """
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    return media in ("", JSON) or (media.startswith("application/") and media.endswith("+json"))


def check_media_type(content_type: str | None, accepted: tuple[str, ...] = (JSON,)) -> str:
    """The body's media type if the route reads it (no header: JSON); 415 otherwise."""
    media = media_type(content_type)
    if _is_json(media) and JSON in accepted:
        return JSON
    if media in accepted:
        return media
    raise UnsupportedMediaType(
        f"a body of type {media!r} is not accepted here; send "
        + " or ".join(f"'Content-Type: {a}'" for a in accepted),
        accepted=list(accepted),
    )


def json_body(model: type[B], content_type: str | None, body: bytes) -> B:
    """The request body as ``model``, parsed and validated in one pass; 415 for another media
    type, 422 (``loc`` under ``body``) for anything else wrong.

    >>> json_body(DistanceBody, "application/json", b'{"a": [1], "b": [2]}').b
    [2.0]
    >>> json_body(DistanceBody, None, b'{"a": [1]}')
    Traceback (most recent call last):
    ...
    service.errors.InvalidInput: body.b: Field required
    """
    check_media_type(content_type)
    if not body:
        raise invalid_request([{"loc": ["body"], "msg": "Field required", "type": "missing"}])
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_request(error_items(exc, ("body",))) from None


#: ``min_version`` has at most this many digits (a seq fits in 64 bits: 20 digits).
_MAX_DIGITS = 20


def min_version(raw: str | None) -> int | None:
    """The ``min_version`` query parameter: a seq, 0 or more (None when absent).

    >>> min_version("12"), min_version(None), min_version("9" * 19)
    (12, None, 9999999999999999999)
    """
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _MAX_DIGITS:
        raise invalid(
            ["query", "min_version"],
            f"must be a seq: an integer >= 0 of at most {_MAX_DIGITS} digits",
        )
    return int(raw)


def certificate_args(delta: float, method: str) -> tuple[float, Method]:
    """``delta`` and ``method`` of a certificate request, checked by the core's rule (e.g. the
    exact binomial inversion only up to ``delta = 0.3``); a 422 naming the query parameter.

    >>> certificate_args(0.05, "kl")
    (0.05, 'kl')
    >>> certificate_args(0.5, "binomial")
    Traceback (most recent call last):
    ...
    service.errors.InvalidInput: query.delta: the exact binomial inversion is valid for \
non-identical tuples up to delta = 0.3 (0.1 per quantity); got 0.5: use method='kl'
    """
    try:
        return check_certificate_args(delta, method)
    except ValueError as exc:
        name, _, msg = str(exc).partition(": ")
        raise invalid(["query", name], msg) from None


def restricted(raw: str | None) -> bool:
    """The ``restricted`` query parameter of ``distance``: ``true`` or ``false`` (absent: false).

    >>> restricted("true"), restricted(None), restricted("false")
    (True, False, False)
    """
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise invalid(["query", "restricted"], "must be true or false")


def learner_config(body: ModelCreate) -> LearnerConfig:
    """The core's configuration of a create body (fields left out take the algorithm's
    defaults). The core's range checks that depend on several fields, on the algorithm (the
    ``step`` values of each) or on the step rule (:mod:`service.core.steps`; its ValueError
    names the field) become a 422 naming ``body.<field>``."""
    values = body.model_dump(exclude={"name"}, exclude_none=True)
    try:
        return LearnerConfig(**values)
    except ValueError as exc:
        field, _, reason = str(exc).partition(": ")
        if field in ModelCreate.model_fields and reason:
            raise invalid(["body", field], reason) from None
        raise invalid(["body"], str(exc)) from None


#: ``?wait`` of ``POST .../samples`` is a boolean as pydantic reads one from text (``true`` /
#: ``false``, ``1`` / ``0``, ``yes`` / ``no``, ``on`` / ``off``, ``t`` / ``f``, ``y`` / ``n``, any
#: case); an ``Idempotency-Key`` has 1-256 characters.
_WAIT = TypeAdapter(bool)
#: The same, as a (JSON Schema) pattern for the OpenAPI description.
WAIT_PATTERN = (
    "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[Yy][Ee][Ss]|[Nn][Oo]|[Oo][Nn]|[Oo][Ff][Ff]|"
    "[01TtFfYyNn])$"
)
MAX_IDEMPOTENCY_KEY = 256
_IDEMPOTENCY_KEY = TypeAdapter(
    Annotated[str, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
)


def wait(raw: str | None) -> bool:
    """The ``?wait`` query parameter (False when absent); ValidationError if not a boolean.

    >>> wait("true"), wait("0"), wait(None), wait("Yes")
    (True, False, False, True)
    """
    return raw is not None and _WAIT.validate_python(raw)


def ingest_options(raw_wait: str | None, idempotency_key: str | None) -> tuple[bool, str]:
    """``?wait`` and the ``Idempotency-Key`` header of ``POST .../samples`` (``''``: none),
    both checked; one 422 lists every bad one (``query.wait``, ``header.Idempotency-Key``).

    >>> ingest_options("true", "req-1"), ingest_options(None, None)
    ((True, 'req-1'), (False, ''))
    >>> try:
    ...     ingest_options("maybe", "")
    ... except InvalidInput as exc:
    ...     print([item["loc"] for item in exc.extra["errors"]])
    [['query', 'wait'], ['header', 'Idempotency-Key']]
    """
    errors: list[dict[str, Any]] = []
    waiting = False
    try:
        waiting = wait(raw_wait)
    except ValidationError as exc:
        errors += error_items(exc, ("query", "wait"))
    if idempotency_key is not None:
        try:
            _IDEMPOTENCY_KEY.validate_python(idempotency_key)
        except ValidationError as exc:
            errors += error_items(exc, ("header", "Idempotency-Key"))
    if errors:
        raise invalid_request(errors)
    return waiting, idempotency_key or ""


#: Arrays of the ``.npz`` body of one-to-many ``distance``: name -> number of dimensions.
DISTANCE_NPZ = {"a": 1, "b": 2}


def distance_body(content_type: str | None, body: bytes, max_bytes: int) -> tuple[Any, Any]:
    """``(a, b)`` of a ``distance`` body: JSON (lists), or ``.npz`` (arrays, shapes checked)."""
    if check_media_type(content_type, (JSON, NPZ)) == NPZ:
        arrays = npz_arrays(body, DISTANCE_NPZ, max_bytes)
        return arrays["a"], arrays["b"]
    parsed = json_body(DistanceBody, content_type, body)
    return parsed.a, parsed.b


#: Arrays of the ``.npz`` body of ``identify``: exactly one of them.
IDENTIFY_NPZ = {"x": 1, "xs": 2}


@dataclass(frozen=True)
class IdentifyRequest:
    """An ``identify`` body: its query rows as sent (a vector, a list of vectors, or an array
    from an ``.npz`` body; checked against the model by :func:`query_rows`), whether it was
    the ``xs`` form, ``k``, ``threshold``, and where ``k`` was given (``loc`` of its errors)."""

    rows: Any
    many: bool
    k: int
    threshold: float | None
    k_loc: list[str | int]
    #: Target rates (at most one of them and ``threshold``).
    far: float | None = None
    frr: float | None = None

    @property
    def loc(self) -> list[str | int]:
        return ["body", "xs" if self.many else "x"]


def identify_body(
    content_type: str | None,
    body: bytes,
    max_bytes: int,
    k: str | None = None,
    threshold: str | None = None,
    far: str | None = None,
    frr: str | None = None,
) -> IdentifyRequest:
    """An ``identify`` request: a JSON body ``{x | xs, k?, threshold? | far? | frr?}``, or an
    ``.npz`` body holding ``x`` (d,) or ``xs`` (n, d) with ``k`` and ``threshold`` / ``far`` /
    ``frr`` from the query string (the same rules as in the JSON body).

    >>> identify_body(None, b'{"x": [1, 2], "k": 2}', 1024).k
    2
    >>> from service.api.npy import npz_bytes
    >>> identify_body(NPZ, npz_bytes(x=np.ones(2)), 1024, far="0.01").far
    0.01
    """
    if check_media_type(content_type, (JSON, NPZ)) == NPZ:
        arrays = npz_arrays(body, IDENTIFY_NPZ, max_bytes, required=False)
        if len(arrays) != 1:
            raise invalid(["body"], "holds either x, shape (d,), or xs, shape (n, d)")
        ((name, rows),) = arrays.items()
        decision = {"threshold": threshold, "far": far, "frr": frr}
        given = [n for n, v in decision.items() if v is not None]
        if len(given) > 1:
            raise invalid(
                ["query", given[1]],
                f"give at most one of threshold, far and frr (got {', '.join(given)})",
            )
        return IdentifyRequest(rows, name == "xs", _count(k, ["query", "k"]),
                               _threshold(threshold), ["query", "k"],
                               _rate(far, "far"), _rate(frr, "frr"))  # fmt: skip
    for raw, param in ((k, "k"), (threshold, "threshold"), (far, "far"), (frr, "frr")):
        if raw is not None:
            raise invalid(["query", param], f"with a JSON body, {param} goes in the body")
    parsed = json_body(IdentifyBody, content_type, body)
    many = parsed.xs is not None
    return IdentifyRequest(parsed.xs if many else parsed.x, many, parsed.k, parsed.threshold,
                           ["body", "k"], parsed.far, parsed.frr)  # fmt: skip


def _number(raw: str) -> float:
    """A query parameter as a float; NaN when it is not a number (every range check fails)."""
    try:
        return float(raw)
    except ValueError:
        return math.nan


def _rate(raw: str | None, name: str) -> float | None:
    """A target rate in the query string (``far`` / ``frr``): a number in (0, 0.5)."""
    if raw is None:
        return None
    value = _number(raw)
    if not 0.0 < value < 0.5:  # NaN fails too
        raise invalid(["query", name], "must be a number in (0, 0.5)")
    return value


def _count(raw: str | None, loc: list[str | int]) -> int:
    """An integer query parameter >= 1 (``k``; 1 when absent)."""
    if raw is None:
        return 1
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _MAX_DIGITS or int(raw) < 1:
        raise invalid(loc, "must be an integer >= 1")
    return int(raw)


def _threshold(raw: str | None) -> float | None:
    """The ``threshold`` query parameter: a finite number >= 0 (None when absent)."""
    if raw is None:
        return None
    value = _number(raw)
    if not (math.isfinite(value) and value >= 0):
        raise invalid(["query", "threshold"], "must be a finite number >= 0")
    return value


def query_rows(request: IdentifyRequest, dim: int) -> Array:
    """The query rows of an identify request as a finite ``(m, dim)`` matrix."""
    rows = request.rows
    if not request.many:
        return vector(rows, dim, request.loc)[None, :]
    if isinstance(rows, np.ndarray):
        return binary_matrix(rows, dim, request.loc)
    return matrix(rows, dim, request.loc)


def _checked(loc: list[str | int], fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise invalid(loc, str(exc).split(": ", 1)[-1]) from None


def vector(value: Sequence[float], dim: int, loc: list[str | int]) -> Array:
    """A finite float64 vector of length ``dim``."""
    return _checked(loc, lambda: check_vector(value, dim, str(loc[-1])))


def matrix(value: Sequence[Sequence[float]], dim: int, loc: list[str | int]) -> Array:
    """A finite float64 matrix with ``dim`` columns (ragged rows are rejected)."""
    for i, row in enumerate(value):
        if len(row) != dim:
            raise invalid([*loc, i], f"expected a vector of length {dim}, got {len(row)} values")
    return _checked(loc, lambda: check_matrix(value, dim, str(loc[-1])))


def binary_matrix(value: Array, dim: int, loc: list[str | int]) -> Array:
    """A finite float64 ``(n, dim)`` matrix from an array (a binary body: shape known, no
    per-row length check needed)."""
    return _checked(loc, lambda: check_matrix(value, dim, str(loc[-1])))


def metric(value: Sequence[Sequence[float]], dim: int) -> Array:
    """A finite ``dim x dim`` matrix within the core's entry bound."""
    return _checked(["body", "L"], lambda: check_metric(value, dim, "L"))


def label(value: Any, loc: list[str | int]) -> str:
    """The class key of a label (integers as their decimal string), at most 128 characters."""
    key = _checked(loc, lambda: label_key(value, str(loc[-1])))
    if len(key) > MAX_LABEL_CHARS:
        raise invalid(loc, f"a label has at most {MAX_LABEL_CHARS} characters")
    return key


def samples(
    items: Sequence[SampleFields], dim: int, loc: list[str | int], indexed: bool
) -> tuple[Array, list[str]]:
    """The rows and class keys of a request's samples, all validated before anything runs.

    ``loc`` locates the samples in the request (``indexed``: a list, so items add their index).
    """
    fast = _samples_fast(items, dim)
    if fast is not None:
        return fast
    # Something is wrong (or unusual): the per-row checks name the first bad element.
    X = np.empty((len(items), dim))
    keys = []
    for i, s in enumerate(items):
        where: list[str | int] = [*loc, i] if indexed else list(loc)
        X[i] = vector(s.x, dim, [*where, "x"])
        keys.append(label(s.y, [*where, "y"]))
    return X, keys


def _samples_fast(items: Sequence[SampleFields], dim: int) -> tuple[Array, list[str]] | None:
    """The common case in one ``np.array`` and one ``isfinite``; None if any check fails
    (then :func:`samples` redoes it row by row to say where)."""
    if len(items) == 1:
        return _one_sample_fast(items[0], dim)
    if any(len(s.x) != dim for s in items):
        return None
    try:
        X = np.array([s.x for s in items], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    if X.shape != (len(items), dim) or not np.isfinite(X).all():
        return None
    keys = _keys_fast([s.y for s in items])
    return None if keys is None else (X, keys)


def _one_sample_fast(s: SampleFields, dim: int) -> tuple[Array, list[str]] | None:
    """:func:`_samples_fast` of one sample (a one-sample request or frame, the commonest
    kind), in fewer steps: the values are Python floats (the schema's), so their plain sum is
    finite only if each of them is (a NaN or an infinity stays in the sum); a sum that
    overflows or a label that is not plain is left to the general path."""
    x = s.x
    if len(x) != dim or not math.isfinite(sum(x)):
        return None
    keys = _keys_fast([s.y])
    return None if keys is None else (np.array(x, dtype=np.float64).reshape(1, dim), keys)


def _keys_fast(labels: list[Any]) -> list[str] | None:
    """The class keys of labels that are all plain strings of 1-128 characters or integers
    (the common case, ~10x cheaper than :func:`label` per element: the core's
    :func:`~service.core._validation.plain_keys`, then one pass over the lengths); None if any
    is not (then :func:`label`, element by element, names the first bad one)."""
    keys = plain_keys(labels)
    if keys is None or (keys and max(map(len, keys)) > MAX_LABEL_CHARS):
        return None
    return keys


@dataclass(frozen=True)
class Block:
    """The samples of a binary WebSocket frame: an (n, d) float64 block (shape checked, values
    not yet), its n labels as sent and their ``holdout`` flags (None: none)."""

    X: Array
    y: list[Any]
    holdout: list[bool] | None = None

    def __len__(self) -> int:
        return len(self.y)


def holdout_flags(items: Sequence[SampleFields] | Block) -> Flags | None:
    """The samples' ``holdout`` flags (True: to the certification reservoir), or None when
    none is set (the common case: nothing extra is logged).

    >>> from service.api.schemas import Sample
    >>> holdout_flags([Sample(x=[1.0], y=1), Sample(x=[1.0], y=2, holdout=True)]).tolist()
    [False, True]
    """
    flags = items.holdout if isinstance(items, Block) else [s.holdout for s in items]
    if flags is None or not any(flags):
        return None
    return np.array(flags, dtype=np.bool_)


def block(b: Block) -> tuple[Array, list[str]]:
    """The rows and class keys of a binary frame; a 422 names the first non-finite row
    (``block.<row>``) or bad label (``y.<i>``)."""
    X = b.X
    if not np.isfinite(X).all():
        bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
        raise invalid(["block", bad], "contains NaN or Inf")
    keys = _keys_fast(b.y)
    if keys is None:
        keys = [label(v, ["y", i]) for i, v in enumerate(b.y)]
    return X, keys


def gallery_items(
    items: list[GalleryItem], dim: int
) -> tuple[Array, list[int | str], list[str], list[int | str | None]]:
    """The vectors, ids, keys (an integer id means its decimal string) and labels of an enrol
    request, all validated before anything runs; ids must be distinct."""
    loc: list[str | int] = ["body", "items"]
    try:
        X = np.array([item.x for item in items], dtype=np.float64)
        ok = X.shape == (len(items), dim) and bool(np.isfinite(X).all())
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:  # say which row is wrong
        X = np.empty((len(items), dim))
        for i, item in enumerate(items):
            X[i] = vector(item.x, dim, [*loc, i, "x"])
    keys: list[str] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        key = str(item.id)
        if len(key) > MAX_ID_CHARS:
            raise invalid([*loc, i, "id"], f"an id has at most {MAX_ID_CHARS} characters")
        if key in seen:
            raise invalid([*loc, i, "id"], f"the same id as item {seen[key]} of this request")
        seen[key] = i
        keys.append(key)
        if item.y is not None:
            label(item.y, [*loc, i, "y"])
    return X, [item.id for item in items], keys, [item.y for item in items]


def finite_or_422(values: Array, what: str) -> Array:
    """``values`` if all finite; else 422 (a float64 overflow must not become JSON Infinity)."""
    if not np.isfinite(values).all():
        raise InvalidInput(
            f"{what} overflows float64 for these inputs; scale the inputs down",
            [{"loc": ["body"], "msg": f"{what} overflows float64", "type": "overflow"}],
        )
    return values
