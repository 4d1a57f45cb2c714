"""``opml``: the service from a shell.

    opml serve [--port 8000] [--data-dir data] ...         # run the service (embedded Redis)
    opml models create faces --dim 128 [--algorithm opml] [--step paper] [--gamma 0.05|auto] ...
    opml models create faces --dim 128 --algorithm sgd [--step descent] [--eta 5e-4] [--mu 0.1]
    opml models list | show faces | delete faces
    opml ingest data.csv --model faces [--label-column kind | --labels y.txt] [--resume-file r]
    opml distance faces --a 0,0,1 --b 0,1,0 [--b 1,0,0 ...] [--restricted]
    opml verify faces --a 0,0,1 --b 0,1,0 [--threshold 0.5]
    opml gallery add gallery.csv --model faces [--id-column name | --ids ids.txt] [--batch 1000]
    opml gallery list faces | delete faces alice-0001
    opml identify faces --x 0,0,1 [--k 5] [--threshold 0.5]
    opml metric export faces --format npy|json [-o L.npy]
    opml certificate faces [--delta 0.05] [--method binomial|kl|pac-bayes] [--threshold 2.5]
    opml events faces [--count 10]

The service address comes from ``--url`` or ``$OPML_URL`` (default http://127.0.0.1:8000);
an API key from ``$OPML_API_KEY`` (no option: a command line ends up in shell history and in
process lists). Output is for people; ``--json`` prints JSON instead (one object per line for
``events``). A vector is ``1,2,3`` or ``[1,2,3]``; write ``--a=-1,2`` when it starts with a
minus sign. A refused connection fails at once (nothing listens at the address); 503 answers
and dropped connections are retried ``--retries`` times.

``opml serve`` runs the service in this process with the service's own command line
(``python -m service``): every setting is an option, ``opml serve --help`` lists them.

``opml ingest`` streams frames of ``--batch`` rows over the WebSocket. Frame ids are derived
from the content of the input and the rows each frame holds, so running the same command again
after an interruption sends nothing twice: frames the service logged before are acknowledged
without being logged again. ``--resume-file`` also records the last acknowledged row, so a rerun
skips straight past it (keep ``--batch`` unchanged between runs).

``opml gallery add`` enrols the rows of a CSV/NPY/NPZ file, the item ids taken from a column
(``--id-column``, the last by default) or a file of their own (``--ids``), in requests of
``--batch`` rows. Each request's ``Idempotency-Key`` is derived from the input and its rows,
so rerunning the command after an interruption writes nothing twice (an id already enrolled
is replaced anyway).

Exit codes:
    0  success
    1  any other failure (a 5xx answer, an unexpected error)
    2  usage error (bad arguments)
    3  not found (no such model)
    4  conflict (the model exists; certificate: too few held-out samples yet)
    5  invalid input (a 400/413/422 answer, a rejected frame, an unreadable data file)
    6  service unavailable (503 or no connection, after the retries)
    7  not authorized (401: no or unknown API key, 403: the key lacks the scope)
    130 interrupted (Ctrl-C)

Only what a command needs is imported when it runs (httpx, websockets and numpy are not
loaded for ``--help`` or a usage error; the service only for ``serve``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from clients.errors import (
    APIError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    NotFound,
    OPMLError,
    Unauthorized,
    Unavailable,
)
from clients.retry import RetryPolicy

if TYPE_CHECKING:
    from clients.sync import OPMLClient
    from clients.types import Model, Progress

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 0, 1, 2, 3, 4
EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_UNAUTHORIZED, EXIT_INTERRUPTED = 5, 6, 7, 130


class UsageError(Exception):
    """A bad argument found after parsing (exit code 2)."""


def _vector(text: str) -> list[float]:
    body = text.strip().removeprefix("[").removesuffix("]")
    try:
        return [float(part) for part in body.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a vector of numbers: {text!r}") from None


def _emit(args: argparse.Namespace, doc: Any, human: str) -> None:
    print(json.dumps(doc) if args.json else human)


def _model_line(m: Model) -> str:
    return (
        f"{m.name:<24} dim={m.dim:<5} {m.algorithm:<7} version={m.version:<9} "
        f"samples={m.samples_seen:<9} classes={m.classes}"
    )


def _model_detail(m: Model) -> str:
    lines = [f"{key}: {value}" for key, value in m.raw.items() if not isinstance(value, dict)]
    for key, value in m.raw.items():
        if isinstance(value, dict):  # its figures; the race's per-rung tables: --json
            shown = (f"{k}={v}" for k, v in value.items() if not _is_table(v))
            lines.append(f"{key}: " + ", ".join(shown))
    return "\n".join(lines)


def _is_table(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def _gamma(text: str) -> float | str:
    """``--gamma``: a number or ``auto``."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or auto, got {text!r}") from None


# -- commands ------------------------------------------------------------------------------------


def cmd_serve(options: list[str]) -> NoReturn:
    """Run the service in this process with its own command line (``python -m service``)."""
    from service.__main__ import main as serve  # the service: only for this command

    serve(options, prog="opml serve")


#: Options of ``models create`` for the gradient learners (sgd, sgd_psd, brm); ``step`` is every
#: algorithm's (its values depend on the algorithm).
GRADIENT = ("step", "eta", "mu", "kappa", "lam")


def cmd_models(args: argparse.Namespace, client: OPMLClient) -> int:
    if args.action == "create":
        options = {
            k: getattr(args, k)
            for k in (
                "algorithm",
                "gamma",
                "gamma_pair",
                "margin",
                "normalize",
                "seed",
                "auto_warmup",
                "rehearsal",
                "rehearsal_memory",
                "precondition",
                "refresh",
                "shrinkage",
                *GRADIENT,
            )
        }
        model = client.create_model(args.name, args.dim, **options)
        _emit(args, model.raw, f"created {_model_line(model)}")
    elif args.action == "list":
        models = client.list_models()
        lines = "\n".join(_model_line(m) for m in models) or "(no models)"
        _emit(args, {"models": [m.raw for m in models]}, lines)
    elif args.action == "show":
        model = client.get_model(args.name)
        _emit(args, model.raw, _model_detail(model))
    else:
        client.delete_model(args.name)
        _emit(args, {"deleted": args.name}, f"deleted {args.name}")
    return EXIT_OK


class ProgressBar:
    """One self-rewriting line on a terminal: rows acked of total, samples/s, acked count."""

    def __init__(self, total: int, done: int, out: TextIO, enabled: bool) -> None:
        self.total, self.done, self.out, self.enabled = total, done, out, enabled
        self._shown = 0.0

    def update(self, p: Progress, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self._shown < 0.1):
            return
        self._shown = now
        rows = self.done + p.acked_samples
        width = 30
        filled = int(width * rows / self.total) if self.total else width
        self.out.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {rows}/{self.total} rows "
            f"{100 * rows / max(self.total, 1):5.1f}%  {p.samples_per_s:9.0f} samples/s  "
            f"acked {p.acked_samples}  reconnects {p.reconnects}"
        )
        if final:
            self.out.write("\n")
        self.out.flush()


def _read_resume(path: Path | None, digest: str) -> tuple[int, int | None]:
    """(rows already acknowledged, the batch size they were sent with) from a resume file."""
    if path is None or not path.exists():
        return 0, None
    state = json.loads(path.read_text())
    if state.get("digest") != digest:
        raise UsageError(f"--resume-file {path}: it records a different input; remove it")
    return int(state["acked_rows"]), int(state["batch"])


def _write_resume(path: Path, digest: str, batch: int, acked_rows: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"digest": digest, "batch": batch, "acked_rows": acked_rows}))
    tmp.replace(path)


def cmd_ingest(args: argparse.Namespace, client: OPMLClient) -> int:
    from clients import datafile

    data = datafile.load(
        args.file,
        label_column=args.label_column,
        labels_path=args.labels,
        x_key=args.x_key,
        y_key=args.y_key,
    )
    start, batch = _read_resume(args.resume_file, data.digest)
    batch = batch or args.batch
    n = len(data.X)
    bar = ProgressBar(n, start, sys.stderr, not args.no_progress and sys.stderr.isatty())

    def on_progress(p: Progress) -> None:
        bar.update(p)
        if args.resume_file is not None:
            _write_resume(args.resume_file, data.digest, batch, start + p.acked_samples)

    stream = client.stream(args.model, window=args.window, on_progress=on_progress)
    with stream:
        width = data.X.shape[1]
        if stream.dim is not None and width != stream.dim:  # None: the key may not read it
            raise ValueError(
                f"{args.file}: the file has {width} features, model {args.model} has dim "
                f"{stream.dim}"
            )
        for lo in range(start, n, batch):
            hi = min(lo + batch, n)
            # The id names the rows, so a rerun's frames are the ones already logged.
            stream.send(data.X[lo:hi], data.y[lo:hi], frame_id=f"{data.digest}:{lo}-{hi}")
    p = stream.progress
    bar.update(p, final=True)
    last = p.last_ack
    summary = {
        "model": args.model,
        "rows": n,
        "skipped_rows": start,
        "acked": p.acked_samples,
        "logged": p.acked_samples - p.replayed_samples,
        "replayed": p.replayed_samples,
        "last_seq": last.last_seq if last else None,
        "reconnects": p.reconnects,
        "seconds": round(p.elapsed_s, 3),
        "samples_per_s": round(p.samples_per_s, 1),
    }
    _emit(
        args,
        summary,
        f"{args.model}: {summary['logged']} samples logged, {summary['replayed']} already "
        f"there, {start} skipped (resume) in {p.elapsed_s:.1f} s "
        f"({p.samples_per_s:.0f} samples/s, {p.reconnects} reconnects)",
    )
    return EXIT_OK


def cmd_distance(args: argparse.Namespace, client: OPMLClient) -> int:
    restricted = args.restricted
    if len(args.b) == 1:
        d = client.distance(
            args.model, args.a, args.b[0], min_version=args.min_version, restricted=restricted
        )
        doc = {k: v for k, v in asdict(d).items() if v is not None}
        human = f"distance {d.distance:.6g} (squared {d.squared_distance:.6g})"
        if d.restricted_distance is not None:
            human += f", restricted {d.restricted_distance:.6g}"
        _emit(args, doc, f"{human} at version {d.version}")
    else:
        ds = client.distances(
            args.model, args.a, args.b, min_version=args.min_version, restricted=restricted
        )
        doc = {
            "distances": ds.distances.tolist(),
            "squared_distances": ds.squared_distances.tolist(),
            "version": ds.version,
        }
        rows = [f"{v:.6g}" for v in ds.distances]
        if ds.restricted_distances is not None and ds.restricted_squared_distances is not None:
            doc["restricted_distances"] = ds.restricted_distances.tolist()
            doc["restricted_squared_distances"] = ds.restricted_squared_distances.tolist()
            rows = [
                f"{v:.6g} restricted {r:.6g}"
                for v, r in zip(ds.distances, ds.restricted_distances, strict=True)
            ]
        human = "\n".join(rows) + f"\n(version {ds.version})"
        _emit(args, doc, human)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, client: OPMLClient) -> int:
    v = client.verify(
        args.model, args.a, args.b, threshold=args.threshold, min_version=args.min_version
    )
    _emit(
        args,
        v.raw,
        f"{'same' if v.same else 'different'}: squared distance "
        f"{v.squared_distance:.6g} vs threshold {v.threshold:.6g} "
        f"({v.threshold_source or 'unknown source'}, version {v.version})",
    )
    return EXIT_OK


def cmd_gallery(args: argparse.Namespace, client: OPMLClient) -> int:
    if args.action == "add":
        from clients import datafile

        data = datafile.load(
            args.file,
            label_column=args.id_column,
            labels_path=args.ids,
            x_key=args.x_key,
            y_key=args.ids_key,
        )
        n, replaced, size = len(data.X), 0, 0
        for lo in range(0, n, args.batch):
            hi = min(lo + args.batch, n)
            key = f"{data.digest}:{lo}-{hi}"  # a rerun's requests are replays
            done = client.enroll(args.model, data.y[lo:hi], data.X[lo:hi], idempotency_key=key)
            replaced, size = replaced + done.replaced, done.size
        summary = {"model": args.model, "items": n, "replaced": replaced, "size": size}
        human = f"{args.model}: {n} items enrolled ({replaced} replaced); the gallery holds {size}"
        _emit(args, summary, human)
    elif args.action == "list":
        ids: list[int | str] = []
        cursor = None
        while True:
            page = client.gallery_list(args.model, cursor=cursor, limit=1000)
            ids += page.ids
            cursor = page.next_cursor
            if cursor is None:
                break
        human = "\n".join(str(i) for i in ids) + f"\n({len(ids)} items)"
        _emit(args, {"count": len(ids), "ids": ids}, human)
    else:
        client.gallery_delete(args.model, args.id)
        _emit(args, {"deleted": args.id}, f"deleted {args.id} from the gallery of {args.model}")
    return EXIT_OK


def cmd_identify(args: argparse.Namespace, client: OPMLClient) -> int:
    found = client.identify(
        args.model, args.x, k=args.k, threshold=args.threshold, min_version=args.min_version
    )
    lines = [
        f"{m.id!s:<24} squared distance {m.squared_distance:<12.6g} "
        f"{'same' if m.same else 'different'}" + ("" if m.y is None else f"  y={m.y}")
        for m in found.matches
    ]
    lines.append(
        f"(version {found.version}, threshold {found.threshold:.6g}: {found.threshold_source})"
    )
    _emit(args, found.raw, "\n".join(lines))
    return EXIT_OK


def cmd_certificate(args: argparse.Namespace, client: OPMLClient) -> int:
    c = client.certificate(
        args.model,
        delta=args.delta,
        method=args.method,
        threshold=args.threshold,
        min_version=args.min_version,
    )
    rows = [
        f"{label:<18} <= {rate.bound:.4f}   ({rate.errors:g} errors in {rate.m}, "
        f"empirical {rate.empirical:.4f})"
        for label, rate in (
            ("false accept rate", c.false_accept),
            ("false reject rate", c.false_reject),
            ("triplet error", c.triplet_error),
        )
    ]
    _emit(args, c.raw, "\n".join([*rows, "", c.statement]))
    return EXIT_OK


def cmd_metric(args: argparse.Namespace, client: OPMLClient) -> int:
    if args.format == "npy":
        if args.output is None and sys.stdout.isatty():
            raise UsageError(
                "metric export: .npy bytes are not for a terminal; write them with -o FILE or "
                "redirect standard output (or print JSON with --format json)"
            )
        import numpy as np

        L = client.metric(args.model, min_version=args.min_version)
        if args.output is None:
            np.save(sys.stdout.buffer, L, allow_pickle=False)
            return EXIT_OK
        np.save(args.output, L, allow_pickle=False)
        shape = f"{L.shape[0]}x{L.shape[1]}"
        _emit(
            args,
            {"output": str(args.output), "shape": list(L.shape)},
            f"wrote L ({shape}) to {args.output}",
        )
        return EXIT_OK
    snap = client.metric_snapshot(args.model, min_version=args.min_version)
    text = json.dumps({"L": snap.L.tolist(), "version": snap.version})
    if args.output is None:
        print(text)
    else:
        args.output.write_text(text)
        _emit(
            args,
            {"output": str(args.output), "version": snap.version},
            f"wrote L at version {snap.version} to {args.output}",
        )
    return EXIT_OK


def cmd_events(args: argparse.Namespace, client: OPMLClient) -> int:
    for seen, event in enumerate(client.events(args.model, interval_ms=args.interval_ms), 1):
        u, v = event.updates, event.verification
        _emit(
            args,
            event.raw,
            f"version={event.version} classes={event.classes} "
            f"triplet={u.get('triplet', 0)} pair={u.get('pair', 0)} "
            f"passive={u.get('passive', 0)} threshold={v.threshold} "
            f"calibrated={v.calibrated} dropped={event.dropped}",
        )
        sys.stdout.flush()
        if args.count is not None and seen >= args.count:
            break
    return EXIT_OK


# -- parser --------------------------------------------------------------------------------------


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


def build_parser() -> argparse.ArgumentParser:
    common = _common(suppress=True)
    parser = argparse.ArgumentParser(
        prog="opml",
        description="Command line of opml-service.",
        epilog=__doc__,
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
    create.add_argument(
        "--precondition",
        choices=["none", "whiten"],
        help="opml/copml/sgd: whiten learns on within-class whitened inputs and serves L W",
    )
    create.add_argument(
        "--refresh",
        type=int,
        help="lda, --precondition whiten: samples between refreshes (default 1000; O(d^3) each)",
    )
    create.add_argument(
        "--shrinkage",
        type=float,
        help="lda, --precondition whiten: covariance shrinkage in [0, 1] (default 0)",
    )
    create.add_argument("--eta", type=float, help="sgd/sgd_psd/brm: gradient step eta > 0")
    create.add_argument("--mu", type=float, help="sgd/sgd_psd: loss smoothing >= 0 (0: hinge)")
    create.add_argument(
        "--kappa", type=float, help="sgd/sgd_psd/brm, step descent: cap fraction in (0, 0.5]"
    )
    create.add_argument(
        "--lam", type=float, help="sgd/sgd_psd/brm: decay lambda >= 0 with 2 eta lam < 1"
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
    sub.choices["verify"].add_argument(
        "--threshold", type=float, help="squared-distance threshold (default: the model's)"
    )

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
    identify.add_argument(
        "--threshold", type=float, help="threshold of 'same' (default: the model's)"
    )
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


def exit_code(error: BaseException) -> int:
    """The exit code an error maps to (see the module docstring)."""
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, Conflict):
        return EXIT_CONFLICT
    if isinstance(error, Unavailable | ConnectionFailed):
        return EXIT_UNAVAILABLE
    if isinstance(error, Unauthorized | Forbidden):
        return EXIT_UNAUTHORIZED
    if isinstance(error, APIError):
        return EXIT_INVALID if 400 <= error.status < 500 else EXIT_FAILURE
    if isinstance(error, ValueError | OSError):
        return EXIT_INVALID
    return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        cmd_serve(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        from clients.sync import OPMLClient  # httpx, websockets, numpy: once a command runs

        # Nobody waits at a shell for a service that is not there: a refused connect fails at
        # once; 503s and dropped connections are retried as in the library.
        retry = RetryPolicy(attempts=max(args.retries, 0), retry_refused=False)
        key = os.environ.get("OPML_API_KEY") or None
        with OPMLClient(args.url, timeout=args.timeout, retry=retry, api_key=key) as client:
            code: int = args.run(args, client)
            return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except UsageError as exc:
        print(f"opml: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OPMLError, ValueError, OSError) as exc:
        print(f"opml: {exc}", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
