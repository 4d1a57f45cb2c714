"""``opml``: the service from a shell.

    opml serve [--port 8000] [--data-dir data] ...         # run the service (embedded Redis)
    opml models create faces --dim 128 [--algorithm opml] [--step paper] [--gamma 0.05|auto] ...
    opml models create faces --dim 128 --algorithm sgd [--step descent] [--eta 5e-4] [--mu 0.1]
    opml models list | show faces | delete faces
    opml ingest data.csv --model faces [--label-column kind | --labels y.txt] [--resume-file r]
    opml distance faces --a 0,0,1 --b 0,1,0 [--b 1,0,0 ...] [--restricted]
    opml verify faces --a 0,0,1 --b 0,1,0 [--threshold 0.5 | --far 0.001 | --frr 0.01]
    opml gallery add gallery.csv --model faces [--id-column name | --ids ids.txt] [--batch 1000]
    opml gallery list faces | delete faces alice-0001
    opml identify faces --x 0,0,1 [--k 5] [--threshold 0.5 | --far 0.001 | --frr 0.01]
    opml roc faces [--points 20] [--delta 0.05] [--out roc.csv]
    opml metric export faces --format npy|json [-o L.npy]
    opml certificate faces [--delta 0.05] [--method binomial|kl|pac-bayes] [--threshold 2.5]
    opml events faces [--count 10]

The service address comes from ``--url`` or ``$OPML_URL`` (default http://127.0.0.1:8000);
an API key from ``$OPML_API_KEY`` (no option: a command line ends up in shell history and in
process lists). Output is for people; ``--json`` prints JSON instead (one object per line for
``events``). Every figure is labelled: ``distance`` prints the distance and the squared
distance; a threshold (``verify``, ``identify``, ``certificate``) is a squared distance. A
vector is ``1,2,3`` or ``[1,2,3]``; write ``--a=-1,2`` when it starts with a minus sign. A
refused connection fails at once (nothing listens at the address); 503 answers and dropped
connections are retried ``--retries`` times.

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
import os
import re
import sys
from collections.abc import Sequence

from clients._cli_commands import (
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNAUTHORIZED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    cmd_serve,
)
from clients._cli_parser import parser_with_help
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


def plain(doc: str) -> str:
    """``doc`` as a terminal shows it: the reST literals and roles of a docstring as plain text.

    >>> plain("run ``opml serve`` (see :mod:`clients.sync`)")
    'run opml serve (see clients.sync)'
    """
    return re.sub(r"(?::\w+:)?``?([^`]+)``?", r"\1", doc)


def build_parser() -> argparse.ArgumentParser:
    """The ``opml`` parser, this module's docstring (as plain text) after its options."""
    return parser_with_help(plain(__doc__ or ""))


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
