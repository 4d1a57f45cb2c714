"""The ``opml`` argument parser: every command, its options and their help."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients._cli_commands import (
    cmd_certificate,
    cmd_distance,
    cmd_events,
    cmd_gallery,
    cmd_identify,
    cmd_ingest,
    cmd_metric,
    cmd_models,
    cmd_roc,
    cmd_verify,
)


def _vector(text: str) -> list[float]:
    body = text.strip().removeprefix("[").removesuffix("]")
    try:
        return [float(part) for part in body.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a vector of numbers: {text!r}") from None


def _operating_point(text: str) -> str | dict[str, float]:
    """``--operating-point``: ``eer``, ``far=X`` or ``frr=X`` (the service checks the range)."""
    if text == "eer":
        return text
    kind, _, value = text.partition("=")
    try:
        if kind in ("far", "frr"):
            return {kind: float(value)}
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected eer, far=X or frr=X, got {text!r}")


def _decision_options(parser: argparse.ArgumentParser, threshold_help: str) -> None:
    """``--threshold`` or a target rate (``--far`` / ``--frr``): at most one."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--threshold", type=float, help=threshold_help)
    group.add_argument(
        "--far",
        type=float,
        help="target false-accept rate in (0, 0.5): the threshold certified to stay below it",
    )
    group.add_argument("--frr", type=float, help="target false-reject rate in (0, 0.5)")


def _gamma(text: str) -> float | str:
    """``--gamma``: a number or ``auto``."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or auto, got {text!r}") from None


def _common(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the command (``opml --json models list`` or
    ``opml models list --json``)."""
    default: Callable[[Any], Any] = (lambda _: argparse.SUPPRESS) if suppress else (lambda v: v)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--url",
        default=default(os.environ.get("OPML_URL", "http://127.0.0.1:8000")),
        help="service address (default $OPML_URL or http://127.0.0.1:8000)",
    )
    p.add_argument("--json", action="store_true", default=default(False), help="JSON output")
    p.add_argument("--timeout", type=float, default=default(30.0), help="seconds per request")
    p.add_argument(
        "--retries",
        type=int,
        default=default(5),
        help="retries of transient failures (503, dropped connections)",
    )
    return p


def parser_with_help(epilog: str) -> argparse.ArgumentParser:
    """The ``opml`` parser; ``epilog``: the text ``opml --help`` shows after the options."""
    common = _common(suppress=True)
    parser = argparse.ArgumentParser(
        prog="opml",
        description="Command line of opml-service.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common(suppress=False)],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # serve talks to no service: none of the client options (--url, --json, ...) apply. Its
    # options (and its --help) are the service's own command line, parsed there (main()).
    sub.add_parser(
        "serve",
        add_help=False,
        help="run the service in this process (opml serve --help: its options)",
    )

    models = sub.add_parser("models", help="create, list, show, delete models")
    actions = models.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", parents=[common], help="create a model")
    create.add_argument("name", help="model name (lower-case letters, digits, - and _)")
    create.add_argument("--dim", type=int, required=True, help="dimension d of the vectors")
    create.add_argument(
        "--algorithm",
        choices=["copml", "opml", "sgd", "sgd_psd", "brm", "lda"],
        help="copml (pairwise cold start), opml, sgd (triplet-loss SGD on L), sgd_psd (SGD on "
        "M with PSD projection, O(d^3) per step), brm (boundary-restricted metric), lda "
        "(Fisher's discriminant metric from within-class statistics kept online)",
    )
    create.add_argument(
        "--step",
        choices=["scaled", "paper", "constant", "descent", "invsqrt"],
        help="step rule; its values depend on the algorithm: opml/copml scaled (default; "
        "gamma, gamma-pair, margin in units of the stream's typical squared difference) or "
        "paper (the paper's rule, in the input's units); sgd/sgd_psd/brm constant, descent "
        "(default) or invsqrt",
    )
    create.add_argument(
        "--gamma",
        type=_gamma,
        help="opml/copml: step size of the triplet update (Eq. 16), or auto: raced on the stream",
    )
    create.add_argument(
        "--gamma-pair", type=float, help="step size of COPML's pairwise stage (Eq. 20)"
    )
    create.add_argument("--margin", type=float, help="hinge margin (Eq. 4)")
    create.add_argument(
        "--auto-warmup",
        type=int,
        help="opml/copml, --gamma auto: twice the race's scoring block, in triplets",
    )
    create.add_argument(
        "--rehearsal",
        type=int,
        help="opml/copml: steps on reservoir samples after each learned sample (default 0)",
    )
    create.add_argument(
        "--rehearsal-memory",
        type=int,
        help="opml/copml: the rehearsal reservoir's size (default 1000)",
    )
    create.add_argument(
        "--normalize", choices=["none", "l2"], help="scale samples and queries to unit norm (l2)"
    )
    create.add_argument("--seed", type=int, help="seed of the negative-class draws")
    create.add_argument("--eta", type=float, help="sgd/sgd_psd/brm: gradient step eta > 0")
    create.add_argument("--mu", type=float, help="sgd/sgd_psd: loss smoothing >= 0 (0: hinge)")
    create.add_argument(
        "--kappa", type=float, help="sgd/sgd_psd/brm, step descent: cap fraction in (0, 0.5]"
    )
    create.add_argument(
        "--lam", type=float, help="sgd/sgd_psd/brm: decay lambda >= 0 with 2 eta lam < 1"
    )
    create.add_argument(
        "--precondition",
        choices=["none", "whiten", "discriminant"],
        help="opml/copml/sgd: learn on within-class whitened (whiten) or discriminant-weighted "
        "inputs and serve L W",
    )
    create.add_argument(
        "--refresh",
        type=int,
        help="lda, --precondition: samples between refreshes (default 1000, discriminant "
        "max(250, 2 d); O(d^3) each)",
    )
    create.add_argument(
        "--shrinkage",
        type=float,
        help="lda, --precondition: covariance shrinkage in [0, 1] (default 0)",
    )
    create.add_argument(
        "--holdout", type=float, help="fraction in [0, 0.5] of samples held out (never learned)"
    )
    create.add_argument(
        "--operating-point",
        type=_operating_point,
        help="what plain verify uses: eer (default), far=X or frr=X (a certified target rate)",
    )
    actions.add_parser("list", parents=[common], help="list the models")
    for action, helptext in (("show", "show a model"), ("delete", "delete a model and its state")):
        shown = actions.add_parser(action, parents=[common], help=helptext)
        shown.add_argument("name", help="model name")
    models.set_defaults(run=cmd_models)

    ingest = sub.add_parser("ingest", help="stream a CSV/NPY/NPZ file", parents=[common])
    ingest.add_argument("file", type=Path, help="samples: .csv, .npy or .npz")
    ingest.add_argument("--model", required=True, help="model to stream into")
    ingest.add_argument("--label-column", help="index or CSV header name (default: last)")
    ingest.add_argument("--labels", type=Path, help="labels file (.npy, or one per line)")
    ingest.add_argument("--x-key", default="X", help="NPZ array of features (default X)")
    ingest.add_argument("--y-key", default="y", help="NPZ array of labels (default y)")
    ingest.add_argument(
        "--batch", type=int, default=256, help="rows per WebSocket frame (default 256)"
    )
    ingest.add_argument("--window", type=int, default=32, help="frames in flight (default 32)")
    ingest.add_argument("--resume-file", type=Path, help="records the last acked row")
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
    ingest.set_defaults(run=cmd_ingest)

    for name, run, helptext in (
        ("distance", cmd_distance, "distance of a to b (or to each b)"),
        ("verify", cmd_verify, "are a and b the same class?"),
    ):
        query = sub.add_parser(name, help=helptext, parents=[common])
        query.add_argument("model", help="model name")
        query.add_argument("--a", type=_vector, required=True, help="vector a, e.g. 0,0.5,1")
        if name == "distance":
            query.add_argument(
                "--b",
                type=_vector,
                required=True,
                action="append",
                help="vector b (repeat: one to many)",
            )
        else:
            query.add_argument("--b", type=_vector, required=True, help="vector b")
        query.add_argument(
            "--min-version", type=int, help="answer once the model has applied this seq"
        )
        query.set_defaults(run=run)
    sub.choices["distance"].add_argument(
        "--restricted",
        action="store_true",
        help="add the restricted distance D_R in [0, 1) (a brm model always adds it)",
    )
    _decision_options(sub.choices["verify"], "squared-distance threshold (default: the model's)")

    gallery = sub.add_parser("gallery", help="enrol, list, delete gallery items")
    gallery_actions = gallery.add_subparsers(dest="action", required=True)
    add = gallery_actions.add_parser("add", parents=[common], help="enrol the items of a file")
    add.add_argument("file", type=Path, help="CSV, .npy or .npz file of vectors (and ids)")
    add.add_argument("--model", required=True, help="model name")
    add.add_argument("--id-column", help="index or CSV header name of the ids (default: last)")
    add.add_argument("--ids", type=Path, help="ids file (.npy, or one per line)")
    add.add_argument("--x-key", default="X", help="NPZ array of vectors (default X)")
    add.add_argument("--ids-key", default="ids", help="NPZ array of ids (default ids)")
    add.add_argument("--batch", type=int, default=1000, help="items per request")
    listing = gallery_actions.add_parser("list", parents=[common], help="every item id")
    listing.add_argument("model", help="model name")
    remove = gallery_actions.add_parser("delete", parents=[common], help="remove one item")
    remove.add_argument("model", help="model name")
    remove.add_argument("id", help="the item's id")
    gallery.set_defaults(run=cmd_gallery)

    identify = sub.add_parser("identify", help="the gallery items nearest to x", parents=[common])
    identify.add_argument("model", help="model name")
    identify.add_argument("--x", type=_vector, required=True, help="the query vector, e.g. 1,0,2")
    identify.add_argument("--k", type=int, default=1, help="matches (default 1)")
    _decision_options(identify, "threshold of 'same' (default: the model's)")
    identify.add_argument(
        "--min-version", type=int, help="answer once the model has applied this seq"
    )
    identify.set_defaults(run=cmd_identify)

    cert = sub.add_parser(
        "certificate", help="certified bounds on the errors of the served metric", parents=[common]
    )
    cert.add_argument("model", help="model name")
    cert.add_argument(
        "--delta", type=float, default=0.05, help="the bounds hold with prob. >= 1 - delta"
    )
    cert.add_argument(
        "--method",
        choices=["binomial", "kl", "pac-bayes"],
        default="binomial",
        help="binomial/kl: held-out test-set bound; pac-bayes: the randomised metric",
    )
    cert.add_argument(
        "--threshold", type=float, help="squared-distance threshold (default: the served one)"
    )
    cert.add_argument("--min-version", type=int, help="certify once the model applied this seq")
    cert.set_defaults(run=cmd_certificate)

    roc = sub.add_parser(
        "roc", help="the held-out ROC: thresholds, estimated and certified rates", parents=[common]
    )
    roc.add_argument("model", help="model name")
    roc.add_argument("--points", type=int, default=20, help="thresholds (default 20)")
    roc.add_argument(
        "--delta", type=float, default=0.05, help="the bounds hold with prob. >= 1 - delta"
    )
    roc.add_argument("--out", type=Path, help="also write the curve as CSV to this file")
    roc.add_argument("--min-version", type=int, help="once the model has applied this seq")
    roc.set_defaults(run=cmd_roc)

    metric = sub.add_parser("metric", help="export L")
    metric_actions = metric.add_subparsers(dest="action", required=True)
    export = metric_actions.add_parser("export", parents=[common], help="write L to a file")
    export.add_argument("model", help="model name")
    export.add_argument(
        "--format", choices=["npy", "json"], default="npy", help="npy (bit-exact) or json"
    )
    export.add_argument(
        "-o", "--output", type=Path, help="file (default: standard output, not a terminal)"
    )
    export.add_argument(
        "--min-version", type=int, help="export once the model has applied this seq"
    )
    metric.set_defaults(run=cmd_metric)

    events = sub.add_parser("events", help="follow a model's events", parents=[common])
    events.add_argument("model", help="model name")
    events.add_argument(
        "--interval-ms", type=int, help="at most one event per this many ms (default 1000)"
    )
    events.add_argument("--count", type=int, help="stop after this many events")
    events.set_defaults(run=cmd_events)
    return parser
