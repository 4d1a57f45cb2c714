"""``python -m service``, ``opml-service`` and ``opml serve``: the service's command line.

Every setting of :class:`service.config.Settings` is both a flag and an ``OPML_*`` environment
variable (``--data-dir`` and ``OPML_DATA_DIR``); a flag wins over the variable, the variable
over the default. ``--help`` lists every setting with its variable and default, and starts
nothing.

Start-up, in this order, so that whatever can refuse to start does so at once, in one line:

1. the flags and variables are checked (a bad value: exit 2, naming the flag or variable);
2. the authentication configuration and the bind rule (exit 2, see :mod:`service.security`);
3. the port is bound (taken: exit 3);
4. the embedded redis-server is started unless ``OPML_REDIS_URL`` names one (a data dir that
   another service uses: exit 3);
5. the server listens: ``/livez`` answers at once. The learning kernels compile in the
   background (numba; on the first start of an installation, tens of seconds; later starts
   load them from numba's on-disk cache in about a second) while the models load;
   ``/readyz`` answers 503 with the reason until both are done, then 200.

SIGINT (Ctrl-C) and SIGTERM stop it gracefully and alike: writers finish their batch, final
checkpoints are written, the embedded redis-server is stopped; then the process ends *by that
signal*, so its exit status says which one stopped it (a shell shows 130 for SIGINT, 143 for
SIGTERM; Python's ``returncode`` is -2 / -15), the Unix convention that lets a calling script
tell "interrupted" from "finished". A second Ctrl-C stops waiting for open connections.

>>> parser = build_parser("opml-service")
>>> settings_from(parser, parser.parse_args(["--port", "9000", "--no-lean-path"])).port
9000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal, NoReturn, get_args, get_origin

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsError

from service import logs
from service.allocator import keep_large_buffers
from service.config import Settings
from service.security import KeyRing, bind_refusal, is_loopback

log = logging.getLogger("service")

#: Exit statuses (also in ``--help``); a stop by a signal ends the process by that signal.
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANNOT_START = 0, 1, 2, 3

EPILOG = """\
A flag wins over its OPML_* environment variable, which wins over the default.

Start-up: the port is bound and the embedded redis-server started (unless --redis-url); then
the service listens (/livez answers) while the learning kernels compile in the background
(first start of an installation only: tens of seconds; later starts load them from numba's
cache) and the models load; /readyz answers 503 with the reason until both are done.

SIGINT (Ctrl-C) and SIGTERM stop it gracefully (writers finish their batch, final checkpoints,
the embedded redis-server stopped), and the process then ends by that signal.

exit status:
  0    --help
  1    an unexpected error (its traceback is logged)
  2    a bad flag or OPML_* value, malformed OPML_API_KEYS, or a non-loopback --host
       without API keys
  3    could not start: the port is taken, another service uses --data-dir, the embedded
       redis-server did not start
  130  stopped by SIGINT (Ctrl-C), after a graceful stop (the process ends by the signal)
  143  stopped by SIGTERM, likewise
"""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _variable(name: str) -> str:
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def _shown(value: Any) -> str:
    """A default as one would write it in the environment."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"not a JSON list: {text!r}")
    return value


def _metavar(name: str, annotation: Any) -> str:
    if name.endswith("_s"):
        return "SECONDS"
    if name.endswith("_url"):
        return "URL"
    if annotation is Path:
        return "DIR"
    if annotation is int:
        return "N"
    return name.upper()


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """One option per setting, generated from :class:`~service.config.Settings`."""
    if prog is None and Path(sys.argv[0]).name == "__main__.py":
        prog = "python -m service"
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [options]",
        description="Run opml-service: streaming online metric learning (OPML / COPML) over "
        "REST and WebSocket, with its own embedded Redis unless --redis-url names one.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        description = (field.description or "").rstrip(".").replace("%", "%%")
        options: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,  # absent: the environment or the default decides
            "help": f"{description} ({_variable(name)}; default {_shown(default)})",
        }
        annotation = field.annotation
        if annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif get_origin(annotation) is Literal:
            options["choices"] = get_args(annotation)
        elif get_origin(annotation) is list:
            options["type"] = _json_list
            options["metavar"] = "JSON"
        else:
            options["metavar"] = _metavar(name, annotation)
        parser.add_argument(_flag(name), **options)
    return parser


def settings_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    """The settings: the flags given, else the environment, else the defaults; a bad value
    exits 2 with one line per problem, naming the flag or the variable it came from."""
    given = vars(args)
    try:
        return Settings(**given)
    except SettingsError as exc:  # a variable that is not JSON where JSON is expected
        named = re.search(r'field "(\w+)"', str(exc))
        where = _variable(named.group(1)) if named else "an OPML_* variable"
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {where}: expected JSON ({exc})\n")
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False, include_input=False):
            message = str(error["msg"]).removeprefix("Value error, ")
            # a check across settings names its field at the start of its message
            field, _, rest = message.partition(": ")
            if error["loc"] or field not in Settings.model_fields:
                field, rest = str(error["loc"][0]) if error["loc"] else "", message
            message = rest
            where = _flag(field) if field in given else _variable(field) if field else ""
            lines.append(f"{parser.prog}: error: {where + ': ' if where else ''}{message}\n")
        parser.exit(EXIT_USAGE, "".join(lines))


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> NoReturn:
    """Parse the command line, run the service, and exit as the module docstring says."""
    parser = build_parser(prog)
    settings = settings_from(parser, parser.parse_args(argv))
    outcome = serve(settings)
    if isinstance(outcome, signal.Signals):
        _end_by(outcome)
    sys.exit(outcome)


class _Stopped(BaseException):
    """SIGINT or SIGTERM during start-up, before uvicorn handles them: unwinds like Ctrl-C
    (so the embedded redis-server, once started, is stopped again)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


def _stopped(signum: int, _: FrameType | None) -> None:
    raise _Stopped(signum)


def serve(settings: Settings) -> int | signal.Signals:
    """Run the service until a signal stops it; the exit status, or the stopping signal."""
    logs.configure(settings.log_level, settings.access_log)
    skipped = keep_large_buffers() if settings.keep_large_buffers else "OPML_KEEP_LARGE_BUFFERS off"
    log.debug("malloc thresholds: %s", skipped or "large buffers kept in the process")
    try:
        keys = KeyRing.parse(settings.api_keys)
    except ValueError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    refusal = bind_refusal(settings.host, keys, settings.allow_insecure_bind)
    if refusal is not None:
        log.error("%s", refusal)
        return EXIT_USAGE
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stopped)
    try:
        with _listening(settings) as sock:
            if sock is None:
                return EXIT_CANNOT_START
            if settings.port == 0:  # a port of the system's choice: advertise the real one
                settings = settings.model_copy(update={"port": sock.getsockname()[1]})
            with _redis(settings) as url:
                if url is None:
                    return EXIT_CANNOT_START
                _log_authentication(settings, keys)
                server = _Server(_config(settings, url))
                server.run(sockets=[sock])
                return server.stopped_by or EXIT_OK
    except _Stopped as stop:
        log.info("stopped during start-up")
        return stop.signal


def _log_authentication(settings: Settings, keys: KeyRing) -> None:
    if keys.enabled:
        log.info("authentication on: %d API key(s) configured", len(keys))
    elif is_loopback(settings.host):
        log.warning(
            "authentication OFF (no OPML_API_KEYS): serving loopback %s only", settings.host
        )
    else:
        log.warning(
            "authentication OFF and OPML_ALLOW_INSECURE_BIND=true: anyone reaching %s:%d can "
            "create, feed and delete models",
            settings.host,
            settings.port,
        )


@contextlib.contextmanager
def _listening(settings: Settings) -> Iterator[socket.socket | None]:
    """The bound server socket (uvicorn listens on it once the app has started), or None
    with the reason logged."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((settings.host, settings.port))
        except OSError as exc:
            log.error(
                "cannot listen on %s port %d (--host, --port / OPML_HOST, OPML_PORT): %s",
                settings.host,
                settings.port,
                exc.strerror or exc,
            )
            yield None
            return
        yield sock
    finally:
        sock.close()


@contextlib.contextmanager
def _redis(settings: Settings) -> Iterator[str | None]:
    """The Redis URL to use: ``OPML_REDIS_URL``, else the embedded redis-server's, started
    here and stopped on the way out (after the app's final checkpoints); None with the reason
    logged when it cannot start."""
    if settings.redis_url is not None:
        yield settings.redis_url
        return
    from service.storage.embedded import EmbeddedRedis

    embedded = EmbeddedRedis(
        settings.data_dir, settings.redis_appendfsync, settings.redis_aof_rewrite_min_mb
    )
    try:  # stop() also undoes a start cut short (by a signal, or a server that did not answer)
        try:
            url = embedded.start()  # supervised: restarted if it dies
        except (RuntimeError, OSError) as exc:  # data dir in use, no binary, did not start
            log.error("cannot start: %s (--data-dir / OPML_DATA_DIR)", exc)
            yield None
            return
        yield url
    finally:
        embedded.stop()


def _config(settings: Settings, redis_url: str) -> uvicorn.Config:
    # here, not at the top: --help and usage errors load neither numba nor FastAPI
    from service.api.protocol import ProblemHttpProtocol
    from service.app import create_app

    return uvicorn.Config(
        create_app(settings, redis_url=redis_url),
        http=ProblemHttpProtocol.with_limits(
            head_timeout_s=settings.head_timeout_s,
            body_grace_s=settings.body_grace_s,
            body_min_rate=settings.body_min_rate,
        ),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # the root logger's, set by logs.configure: one format for every line
        access_log=logs.access_log(settings.log_level, settings.access_log),
        ws_max_size=settings.max_body_bytes,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        timeout_graceful_shutdown=5,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, except that the signal that stopped it is kept (:attr:`stopped_by`)
    rather than raised again inside uvicorn: the process ends by it only once the embedded
    redis-server has stopped too."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stopped_by: signal.Signals | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {signum: signal.signal(signum, self.handle_exit) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopped_by = self.stopped_by or signal.Signals(sig)
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            log.info("listening on http://%s:%d (Ctrl-C or SIGTERM stops it)", shown, port)


def _end_by(signum: signal.Signals) -> NoReturn:
    """End the process by ``signum`` (its default action), so the exit status says which
    signal stopped it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # only if the signal is blocked


if __name__ == "__main__":
    main()
