"""One launcher of the service as a real subprocess, for the tests, the benchmarks and scripts.

:class:`ServiceProcess` runs ``python -m service`` on a free loopback port with the ``OPML_*``
settings it is given (its own embedded redis-server in ``<workdir>/data``, or the Redis at a
given URL), waits until ``GET /readyz`` answers 200, and stops it within a bound:

* **Start** (:meth:`~ServiceProcess.start`): spawn, then poll ``/readyz`` until a deadline.
  If the process exits first, :class:`RuntimeError`; if the deadline passes,
  :class:`TimeoutError`; either way the message ends with the tail of the service's log, and a
  process that is still running is stopped before the error is raised.
  :meth:`~ServiceProcess.spawn` and :meth:`~ServiceProcess.wait_ready` are the two halves, for
  a caller that wants to look at a service that never becomes ready
  (:meth:`~ServiceProcess.wait_answering`: its first answer, ready or not).
* **Stop** (:meth:`~ServiceProcess.stop`): SIGTERM (the service's graceful shutdown: writers
  finish their batch, final checkpoints, the embedded redis-server is shut down), SIGCONT in
  case it is paused, then wait up to ``stop_timeout`` seconds. Past that, SIGKILL to its whole
  process group, the embedded redis-server of its data dir is terminated too, and
  :class:`TimeoutError` reports the failed graceful shutdown (with the log tail): the caller
  learns that the service hung, and no process is left behind.
* **Signals**: :meth:`~ServiceProcess.kill` (SIGKILL: the crash case; an embedded
  redis-server survives it, as it would a real crash), :meth:`~ServiceProcess.pause` (SIGSTOP)
  and :meth:`~ServiceProcess.resume` (SIGCONT).
* **No leaks**: a context manager (``with ServiceProcess(...) as svc``: started on entry,
  :meth:`~ServiceProcess.close` on exit, however the block ends); :meth:`close` also ends an
  embedded redis-server that outlived a :meth:`kill`. Every launcher still running when the
  interpreter exits is closed by an ``atexit`` hook (a test run interrupted by Ctrl-C).

Choices where nothing else decides:

* The service runs in its own session (``start_new_session``), hence its own process group:
  a Ctrl-C meant for the caller does not reach it, and the forced stop can SIGKILL the group
  (the service and any child in it). The embedded redis-server runs in a session of its own
  (see :mod:`service.storage.embedded`), so the launcher finds it through ``redis.json`` in
  the data dir, and signals it only if no service holds the dir's lock (else it is that
  service's server) and the pid is a ``redis-server`` working in that dir (not a reused pid).
* The environment is the caller's minus every ``OPML_*`` variable, plus the given settings:
  a shell that exports, say, ``OPML_API_KEYS`` does not change what a test or benchmark runs.
  Defaults: ``OPML_HOST=127.0.0.1``, ``OPML_LOG_LEVEL=warning``.
* ``root`` runs the ``service`` package of another checkout (``PYTHONPATH`` and working dir),
  e.g. the "before" side of a benchmark; by default this package's own checkout.
* The port is drawn once, when the launcher is made, so a restart (``stop()`` then
  ``start()``) keeps the URL; the log (``<workdir>/service-<port>.log``) is appended to.

Example (a real service with its embedded Redis; about 2 s once numba's cache is warm):

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as tmp:
...     with ServiceProcess(Path(tmp), OPML_MAX_DIM="8") as svc, svc.client() as api:
...         created = api.post("/v1/models", json={"name": "m", "dim": 2}).status_code
...         ready = api.get("/readyz").status_code
...     exited = svc.returncode
>>> created, ready, svc.running, exited
(201, 200, False, -15)
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from service.storage.embedded import LOCK_FILE, STATE_FILE, free_port

#: The checkout this module belongs to (working dir of ``python -m service`` by default).
ROOT = Path(__file__).resolve().parents[1]
#: How much of the service's log an error message quotes.
LOG_TAIL_CHARS = 3000
#: Bound on a process's exit once it has been sent SIGKILL.
KILL_WAIT_S = 10.0
#: Interval of the readiness poll (a wait on the process's exit, not a sleep).
POLL_S = 0.05

#: Launchers whose process may still run (strong references: one dropped unclosed is still
#: closed at exit).
_live: set[ServiceProcess] = set()


class ServiceProcess:
    """``python -m service`` as a subprocess on a free loopback port (see the module docstring).

    ``workdir`` holds the log and ``data/`` (the embedded Redis's dir, ``OPML_DATA_DIR``);
    ``redis_url`` selects an external Redis instead; ``settings`` are ``OPML_*`` variables.

    >>> svc = ServiceProcess(Path("/tmp/opml-launcher-doctest"), "redis://127.0.0.1:6379/0",
    ...                      OPML_LEASE_TTL_S="2")
    >>> svc.url == f"http://127.0.0.1:{svc.port}", svc.running, svc.returncode
    (True, False, None)
    >>> ServiceProcess(Path("/tmp/x"), None, LEASE_TTL_S="2")
    Traceback (most recent call last):
    ...
    ValueError: settings: 'LEASE_TTL_S' is not an OPML_* variable
    """

    def __init__(
        self,
        workdir: Path,
        redis_url: str | None = None,
        *,
        root: Path | None = None,
        stop_timeout: float = 30.0,
        **settings: str,
    ) -> None:
        for key in settings:
            if not key.startswith("OPML_"):
                raise ValueError(f"settings: {key!r} is not an OPML_* variable")
        if stop_timeout <= 0:
            raise ValueError(f"stop_timeout: must be > 0, got {stop_timeout}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.log_path = workdir / f"service-{self.port}.log"
        self.redis_url = redis_url
        self.root = root
        self.stop_timeout = stop_timeout
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPML_")}
        env |= {
            "OPML_HOST": "127.0.0.1",
            "OPML_PORT": str(self.port),
            "OPML_DATA_DIR": str(self.data_dir),
            "OPML_LOG_LEVEL": "warning",
            **settings,
        }
        if redis_url is not None:
            env["OPML_REDIS_URL"] = redis_url
        if root is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        #: The child's whole environment.
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The process id of the current (or last) run."""
        if self._proc is None:
            raise RuntimeError("the service was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process has not exited (also while paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run (negative: the signal that ended it); None while it
        runs or before the first start."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the service's log (stdout and stderr of every run)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def embedded_redis(self) -> tuple[int, int] | None:
        """``(pid, port)`` of the embedded redis-server as ``<data_dir>/redis.json`` records
        it; None with an external Redis, before the server started or after a clean stop."""
        if self.redis_url is not None:
            return None
        try:
            state = json.loads((self.data_dir / STATE_FILE).read_text())
            return int(state["pid"]), int(state["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def client(self, timeout: float = 30.0) -> httpx.Client:
        """An HTTP client on the service (close it, or use it in a ``with``)."""
        return httpx.Client(base_url=self.url, timeout=timeout)

    # -- start -------------------------------------------------------------------------------

    def spawn(self) -> ServiceProcess:
        """Start the process and return at once (see :meth:`wait_ready`)."""
        if self.running:
            raise RuntimeError(f"the service is already running (pid {self.pid})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "service"],
                cwd=self.root or ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        _live.add(self)
        return self

    def wait_ready(self, timeout: float = 60.0) -> ServiceProcess:
        """Wait until ``/readyz`` answers 200: :class:`RuntimeError` if the process exits
        first, :class:`TimeoutError` after ``timeout`` seconds (the process is left as it
        is: the caller may look at it, and stops it)."""
        self._poll_readyz(lambda answer: answer.status_code == 200, timeout, "ready")
        return self

    def wait_answering(self, timeout: float = 60.0) -> httpx.Response:
        """Wait until the service answers HTTP at all, ready or not (e.g. 503 while its Redis
        refuses it); its first ``/readyz`` answer. Errors as :meth:`wait_ready`."""
        return self._poll_readyz(lambda answer: True, timeout, "answering")

    def _poll_readyz(
        self, done: Callable[[httpx.Response], bool], timeout: float, what: str
    ) -> httpx.Response:
        proc = self._proc
        if proc is None:
            raise RuntimeError("the service was never started")
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=2.0) as probe:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"service exited with status {proc.returncode} before it was {what}; "
                        f"end of {self.log_path}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    answer = probe.get("/readyz")
                    if done(answer):
                        return answer
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"service not {what} within {timeout} s; end of {self.log_path}:\n"
                        f"{self.log_tail()}"
                    )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(POLL_S)  # the next probe at once if it exits meanwhile

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """:meth:`spawn` and :meth:`wait_ready`; a service that does not become ready is
        stopped before the error is raised."""
        self.spawn()
        try:
            return self.wait_ready(timeout)
        except BaseException:
            self.close()
            raise

    # -- signals and stop --------------------------------------------------------------------

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)  # pgid == pid: the service leads its own session

    def pause(self) -> None:
        """SIGSTOP: the service freezes (its timers, leases and connections with it)."""
        self._require_running()
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused service carries on."""
        self._require_running()
        self._signal_group(signal.SIGCONT)

    def kill(self) -> int:
        """SIGKILL to the process group: the crash case (no shutdown; an embedded
        redis-server, in its own session, survives as it would a real crash). Returns the
        exit status (``-9``)."""
        self._require_running()
        return self._kill_group()

    def stop(self, timeout: float | None = None) -> int | None:
        """Graceful stop, bounded: SIGTERM, SIGCONT, then wait up to ``timeout`` (default
        ``stop_timeout``) seconds. Returns the exit status (uvicorn re-raises the SIGTERM
        after its shutdown: ``-15``), or the last one if the service was not running (None if
        it never ran). Past the bound: SIGKILL to its process group, end its embedded
        redis-server, and :class:`TimeoutError` with the tail of the log."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return self.returncode
        bound = self.stop_timeout if timeout is None else timeout
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        self._signal_group(signal.SIGCONT)  # a paused service must run to handle it
        try:
            return proc.wait(bound)
        except subprocess.TimeoutExpired:
            pass
        self._kill_group()
        self._end_embedded_redis()
        raise TimeoutError(
            f"service pid {proc.pid} did not exit within {bound} s of SIGTERM; its process "
            f"group was killed. End of {self.log_path}:\n{self.log_tail()}"
        )

    def close(self) -> None:
        """Stop the service if it runs (:meth:`stop`), and end an embedded redis-server of
        its data dir that outlived it (after :meth:`kill`). Safe to call more than once."""
        try:
            self.stop()
        finally:
            self._end_embedded_redis()
            _live.discard(self)

    def __enter__(self) -> ServiceProcess:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError(f"the service is not running (exit status {self.returncode})")

    def _kill_group(self) -> int:
        proc = self._proc
        assert proc is not None
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # the leader, should it have left its group
        return proc.wait(KILL_WAIT_S)

    def _end_embedded_redis(self) -> None:
        """SIGTERM (then SIGKILL) the redis-server recorded in ``<data_dir>/redis.json`` if it
        still runs in that dir and no service holds the dir's lock (else it is that service's
        server, e.g. a second launcher on a dir in use). A service that stops gracefully
        ends its server and removes the file itself."""
        server = self.embedded_redis()
        if server is None:
            return
        pid = server[0]
        try:
            lock = open(self.data_dir / LOCK_FILE, "a")  # noqa: SIM115 (closed below)
        except OSError:
            return
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                return  # gone already
            try:
                if self._is_our_redis(pid):
                    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, KILL_WAIT_S)):
                        with contextlib.suppress(ProcessLookupError):
                            signal.pidfd_send_signal(fd, sig)
                        if select.select([fd], [], [], wait)[0]:  # readable once it exited
                            break
            finally:
                os.close(fd)

    def _is_our_redis(self, pid: int) -> bool:
        """``pid`` is a redis-server working in this data dir (not a reused pid)."""
        proc = Path(f"/proc/{pid}")
        try:
            return b"redis-server" in (proc / "cmdline").read_bytes() and (
                (proc / "cwd").resolve() == self.data_dir.resolve()
            )
        except OSError:
            return False


@atexit.register
def _close_all() -> None:
    """Close every launcher still running when the interpreter exits (a run interrupted by
    Ctrl-C, a script that raised): no service outlives its caller."""
    for svc in list(_live):
        with contextlib.suppress(Exception):
            svc.close()
