"""What each ``opml`` command does once its arguments are parsed: the calls it makes and the
lines it prints (``--json``: the documents instead). Nothing heavy is imported here at module
level: httpx, websockets and numpy load when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from clients.sync import OPMLClient
    from clients.types import Model, Progress

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 0, 1, 2, 3, 4
EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_UNAUTHORIZED, EXIT_INTERRUPTED = 5, 6, 7, 130


class UsageError(Exception):
    """A bad argument found after parsing (exit code 2)."""


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


def cmd_serve(options: list[str]) -> NoReturn:
    """Run the service in this process with its own command line (``python -m service``)."""
    try:
        from service.__main__ import main as serve  # the service: only for this command
    except ModuleNotFoundError as exc:
        # The SDK installs alone (its own distribution); the server is another one.
        raise SystemExit(  # exit status 1, the message on standard error
            f"opml: opml serve runs the service, which is not installed here ({exc}); "
            "install opml-service (the repository's root) next to the client"
        ) from None

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
        for extra in ("holdout", "operating_point"):  # sent only when given
            if getattr(args, extra) is not None:
                options[extra] = getattr(args, extra)
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


def _table(header: list[str], rows: list[list[float]]) -> list[str]:
    """Right-aligned columns under their ``header`` (each number to 6 significant digits).

    >>> print("\\n".join(_table(["distance", "squared distance"], [[0.5, 0.25]])))
    distance  squared distance
         0.5              0.25
    """
    cells = [[f"{v:.6g}" for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = [header, *cells]
    return ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines]


def cmd_distance(args: argparse.Namespace, client: OPMLClient) -> int:
    """Every figure labelled: ``distance`` (the metric's, sqrt of Eq. 2's value) and ``squared
    distance`` (the unit of every threshold) side by side, one row per ``--b``."""
    restricted = args.restricted
    if len(args.b) == 1:
        d = client.distance(
            args.model, args.a, args.b[0], min_version=args.min_version, restricted=restricted
        )
        doc = {k: v for k, v in asdict(d).items() if v is not None}
        human = f"distance {d.distance:.6g}, squared distance {d.squared_distance:.6g}"
        if d.restricted_distance is not None:
            human += f", restricted distance {d.restricted_distance:.6g}"
        _emit(args, doc, f"{human} (version {d.version})")
        return EXIT_OK
    ds = client.distances(
        args.model, args.a, args.b, min_version=args.min_version, restricted=restricted
    )
    doc = {
        "distances": ds.distances.tolist(),
        "squared_distances": ds.squared_distances.tolist(),
        "version": ds.version,
    }
    header = ["distance", "squared distance"]
    columns = [ds.distances, ds.squared_distances]
    if ds.restricted_distances is not None and ds.restricted_squared_distances is not None:
        doc["restricted_distances"] = ds.restricted_distances.tolist()
        doc["restricted_squared_distances"] = ds.restricted_squared_distances.tolist()
        header.append("restricted distance")
        columns.append(ds.restricted_distances)
    rows = [[float(v) for v in row] for row in zip(*columns, strict=True)]
    _emit(args, doc, "\n".join([*_table(header, rows), f"(version {ds.version})"]))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, client: OPMLClient) -> int:
    """The decision in the threshold's unit (a squared distance; a brm model decides on the
    restricted one), the plain distance beside it."""
    v = client.verify(
        args.model,
        args.a,
        args.b,
        threshold=args.threshold,
        min_version=args.min_version,
        far=args.far,
        frr=args.frr,
    )
    restricted = v.raw.get("restricted_squared_distance")
    decided, unit = (
        (v.squared_distance, "squared distance")
        if restricted is None
        else (float(restricted), "restricted squared distance")
    )
    _emit(
        args,
        v.raw,
        f"{'same' if v.same else 'different'}: {unit} {decided:.6g} "
        f"{'<=' if v.same else '>'} threshold {v.threshold:.6g} "
        f"(distance {v.squared_distance**0.5:.6g}; threshold from "
        f"{v.threshold_source or 'an unnamed source'}, version {v.version})"
        + _point_text(v.operating_point),
    )
    return EXIT_OK


def _point_text(point: dict[str, Any] | None) -> str:
    """A certified operating point in a line (empty without one)."""
    if point is None:
        return ""
    return (
        f"\ncertified at delta {point['delta']:g}: false accept rate <= "
        f"{point['far_bound']:.4g} (estimate {point['far_estimate']:.4g} on "
        f"{point['negatives']} pairs), false reject rate <= {point['frr_bound']:.4g} "
        f"(estimate {point['frr_estimate']:.4g} on {point['positives']} pairs)"
    )


def _cell(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:9.4g}"


def cmd_roc(args: argparse.Namespace, client: OPMLClient) -> int:
    """The held-out ROC as a table; ``--out`` also writes it as CSV."""
    curve = client.roc(
        args.model, points=args.points, delta=args.delta, min_version=args.min_version
    )
    if args.out is not None:
        text = client.roc(
            args.model,
            points=args.points,
            delta=args.delta,
            min_version=curve["version"],
            csv=True,
        )
        args.out.write_text(text)
    header = (
        f"{'threshold':>12} {'far':>9} {'far<=':>9} {'frr':>9} {'frr<=':>9} "
        f"{'window far':>10} {'window frr':>10}"
    )
    rows = [
        f"{p['threshold']:12.6g} {p['far_estimate']:9.4g} {p['far_bound']:9.4g} "
        f"{p['frr_estimate']:9.4g} {p['frr_bound']:9.4g} {_cell(p['window_far']):>10} "
        f"{_cell(p['window_frr']):>10}"
        for p in curve["points"]
    ]
    footer = (
        f"(version {curve['version']}, {curve['negatives']} negative and {curve['positives']} "
        f"positive held-out pairs; bounds hold together with prob. >= {1 - curve['delta']:g})"
    )
    if args.out is not None:
        footer += f"\nwritten to {args.out}"
    _emit(args, curve, "\n".join([header, *rows, footer]))
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
        args.model,
        args.x,
        k=args.k,
        threshold=args.threshold,
        min_version=args.min_version,
        far=args.far,
        frr=args.frr,
    )
    lines = [
        f"{m.id!s:<24} squared distance {m.squared_distance:<12.6g} "
        f"{'same' if m.same else 'different'}" + ("" if m.y is None else f"  y={m.y}")
        for m in found.matches
    ]
    if found.unknown:
        lines.append("unknown: no gallery item passes the threshold")
    lines.append(
        f"(version {found.version}, threshold {found.threshold:.6g} on the squared distance: "
        f"{found.threshold_source})"
    )
    _emit(args, found.raw, "\n".join(lines) + _point_text(found.operating_point))
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
