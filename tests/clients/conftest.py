"""Fixtures of the SDK/CLI tests: the service tests' real Redis + service subprocess, an SDK
client on it, a TCP proxy whose connections a test can cut (the server side of a stream
closing mid-way), and :func:`opml`, the command line run as a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import OPMLClient, RetryPolicy
from tests.service.conftest import name, redis_url, service
from tests.service.support import ServiceProcess

__all__ = ["name", "redis_url", "service"]

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


#: Quick retries: tests wait for the real service, never for a long backoff.
FAST_RETRY = RetryPolicy(attempts=8, base_delay_s=0.01, max_delay_s=0.2)


@pytest.fixture
def client(service: ServiceProcess) -> Iterator[OPMLClient]:
    with OPMLClient(service.url, retry=FAST_RETRY) as c:
        yield c


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


@pytest.fixture
def proxy(service: ServiceProcess) -> Iterator[CuttableProxy]:
    p = CuttableProxy(service.port)
    yield p
    p.close()
