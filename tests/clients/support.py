"""Helpers of the SDK/CLI tests: :func:`opml`, the command line run as a subprocess;
:func:`served`, an ``opml serve`` of its own; quick retries; a TCP proxy whose connections a
test can cut (the server side of a stream closing mid-way)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from clients import RetryPolicy
from tests.service.support import ServiceProcess

OPML = str(Path(sys.executable).with_name("opml"))


def opml(
    service: ServiceProcess, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``opml --url <service> *args``, ``env`` added to this process's environment."""
    return subprocess.run(
        [OPML, "--url", service.url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )


class Served:
    """``opml serve *options`` as a subprocess (no ``OPML_*`` variable inherited), ready; its
    log (standard error) goes to ``log``."""

    def __init__(self, url: str, log: Path, *options: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPML_")}
        self.log = log
        with log.open("ab") as sink:
            self.proc = subprocess.Popen(
                [OPML, "serve", *options], env=env, stdout=subprocess.DEVNULL, stderr=sink
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stop()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"opml serve did not become ready: {self.stop()}")

    def stop(self) -> str:
        """SIGTERM (once), wait, and what the service logged."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def served(url: str, log: Path, *options: str) -> Iterator[Served]:
    proc = Served(url, log, *options)
    try:
        yield proc
    finally:
        proc.stop()


#: Quick retries: tests wait for the real service, never for a long backoff.
FAST_RETRY = RetryPolicy(attempts=8, base_delay_s=0.01, max_delay_s=0.2)


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to the service; :meth:`cut` closes every open connection
    on both sides at once, like a server or network dropping them."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cuts = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.cuts += 1

    def close(self) -> None:
        self.listener.close()
        self.cut()
