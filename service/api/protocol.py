"""The HTTP protocol the service runs: uvicorn's httptools protocol, except for the requests
its parser refuses.

uvicorn answers a request that ``httptools`` cannot parse (a malformed request line, an empty
``Transfer-Encoding``, a bad chunk size, ...) with a ``text/plain`` 400 and closes the
connection, before any ASGI layer sees it. Every other bad input gets a problem+json answer
(:mod:`service.api.problems`), so this one does too: the same 400 and connection close, with
the ``bad-request`` problem document as its body.

>>> ProblemHttpProtocol.problem_body("Invalid HTTP request received.")[:40]
b'{"type":"/problems/bad-request","title":'
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.api.problems import HttpError, problem


class ProblemHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a problem+json answer to an unparsable request."""

    @staticmethod
    def problem_body(msg: str) -> bytes:
        return json.dumps(problem(HttpError(400, msg)), separators=(",", ":")).encode()

    def send_400_response(self, msg: str) -> None:
        body = self.problem_body(msg)
        content = [STATUS_LINE[400]]
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
