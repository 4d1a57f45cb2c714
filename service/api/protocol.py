"""The HTTP protocol the service runs: uvicorn's httptools protocol, with problem+json answers
to the requests its parser refuses, and slow clients cut off.

**Unparsable requests.** uvicorn answers a request that ``httptools`` cannot parse (a malformed
request line, an empty ``Transfer-Encoding``, a bad chunk size, ...) with a ``text/plain`` 400
and closes the connection, before any ASGI layer sees it. Every other bad input gets a
problem+json answer (:mod:`service.api.problems`), so this one does too: the same 400 and
connection close, with the ``bad-request`` problem document as its body.

**Slow clients.** A connection that trickles its request head, or stalls in its body, would
otherwise hold its socket and file descriptor for ever (uvicorn bounds only the idle time
*between* requests, and any byte restarts that bound). So:

* the request head must be complete within ``OPML_HEAD_TIMEOUT_S`` of the connection's opening
  (its first request) or of the head's first byte (a later request on a kept-alive connection);
* a body must arrive at ``OPML_BODY_MIN_RATE`` bytes/s or faster after a grace period of
  ``OPML_BODY_GRACE_S``: it may take ``grace + received / rate`` seconds in all, each byte
  received earning more time (the rule of Apache's ``mod_reqtimeout``), so a slow but steady
  upload passes and a stalled one does not.

Past either limit the connection is answered ``408`` (a ``request-timeout`` problem, with
``Connection: close``) and closed, if nothing has been answered on it yet for that request and
part of a request was received; otherwise (a connection that sent nothing at all, or a request
whose answer has started, e.g. a 401 sent before an unread body) it is closed without an answer.
The ASGI application, if it was waiting for that body, sees the client disconnect. Time the
service itself does not read (its flow control paused reading, or the client waits for
``100 Continue``) is not counted against the client. A timer is armed only for a head or body
that spans several reads (and one per connection, for its first head), none per byte or chunk
(a chunk adds its length to a counter); ``0`` turns a limit off.
``opml_http_slow_clients_closed_total{phase}`` counts the connections closed so.

Behind a reverse proxy, the proxy should enforce the same limits on the client side (nginx
``client_header_timeout`` and ``client_body_timeout``, HAProxy ``timeout http-request``) and,
since it buffers or relays bodies at its own pace, keep its upstream connections well within
these bounds, or raise them for the proxy's sake: the proxy is then the only client.

>>> ProblemHttpProtocol.problem_body(400, "Invalid HTTP request received.")[:40]
b'{"type":"/problems/bad-request","title":'
>>> limited = ProblemHttpProtocol.with_limits(head_timeout_s=10, body_grace_s=9, body_min_rate=9)
>>> limited.head_timeout_s, issubclass(limited, ProblemHttpProtocol)
(10.0, True)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service import telemetry
from service.api.problems import HttpError, problem

_CLOSED_HEAD = telemetry.SLOW_CLIENTS_CLOSED.labels("head")
_CLOSED_BODY = telemetry.SLOW_CLIENTS_CLOSED.labels("body")


class ProblemHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a problem+json answer to an unparsable request and
    the slow-client limits of :meth:`with_limits` (off in this class itself)."""

    #: Seconds for a request head; 0: no limit.
    head_timeout_s: float = 0.0
    #: Seconds a body may take before its rate counts.
    body_grace_s: float = 0.0
    #: Least average body rate in bytes/s after the grace; 0: no limit.
    body_min_rate: float = 0.0

    @classmethod
    def with_limits(
        cls, *, head_timeout_s: float, body_grace_s: float, body_min_rate: float
    ) -> type[ProblemHttpProtocol]:
        """This protocol with these slow-client limits (uvicorn takes a class, not an
        instance: the limits are class attributes of a subclass)."""
        return type(
            "LimitedHttpProtocol",
            (cls,),
            {
                "head_timeout_s": float(head_timeout_s),
                "body_grace_s": float(body_grace_s),
                "body_min_rate": float(body_min_rate),
            },
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since = 0.0  # when the head's time started
        self._head_begun = False
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_since: float | None = None  # when the body began; None: none expected
        self._body_bytes = 0

    @staticmethod
    def problem_body(status: int, msg: str) -> bytes:
        return json.dumps(problem(HttpError(status, msg)), separators=(",", ":")).encode()

    def _answer_and_close(self, status: int, msg: str) -> None:
        body = self.problem_body(status, msg)
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/problem+json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._answer_and_close(400, msg)

    # -- slow clients ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._head_timer is None:  # a later request: its head's time starts now
            self._head_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._cancel_head()
        self._head_begun = False
        super().on_headers_complete()
        if self.body_min_rate > 0 and not (self.parser.should_upgrade() and self._should_upgrade()):
            # a body may follow; if none does, on_message_complete comes within this same feed,
            # before data_received would arm the timer
            self._body_since = self.loop.time()
            self._body_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_since = None
        self._cancel_body()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # timers only for a head or body that spans reads: a request that arrives whole in
        # one read (the common case) arms none
        if self._head_begun and self._head_timer is None and self.head_timeout_s > 0:
            self._head_timer = self.loop.call_later(
                self._head_since + self.head_timeout_s - self.loop.time(), self._head_expired
            )
        if self._body_since is not None and self._body_timer is None:
            self._body_timer = self.loop.call_later(self._body_allowance(), self._check_body)

    def _arm_head(self) -> None:
        self._head_since = self.loop.time()
        if self.head_timeout_s > 0:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_allowance(self) -> float:
        """Seconds from the body's start it may take, given the bytes received so far."""
        return self.body_grace_s + self._body_bytes / self.body_min_rate

    def _in_flight(self) -> bool:
        """True while an earlier answer on this connection is not complete (pipelining)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        _CLOSED_HEAD.inc()
        if self._head_begun and not self._in_flight() and not self.pipeline:
            self._answer_and_close(
                408, f"the request head was not complete within {self.head_timeout_s:g} s"
            )
        else:
            self.transport.close()

    def _check_body(self) -> None:
        self._body_timer = None
        if self._body_since is None or self.transport.is_closing():
            return
        now = self.loop.time()
        cycle = self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            # the service is not reading, or the client rightly waits for 100 Continue
            self._body_since, self._body_bytes = now, 0
        due = self._body_since + self._body_allowance()
        if now < due:
            self._body_timer = self.loop.call_later(due - now, self._check_body)
            return
        _CLOSED_BODY.inc()
        if cycle is None or cycle.response_started or self.pipeline:
            self.transport.close()
            return
        # the application sees a disconnect, and whatever it answers later is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        self._answer_and_close(
            408,
            f"the request body arrived slower than {self.body_min_rate:g} bytes/s "
            f"(after a grace of {self.body_grace_s:g} s)",
        )
