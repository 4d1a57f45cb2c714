"""Body-size limit, enforced before a large body is read.

A declared ``Content-Length`` over the limit is answered 413 at once; a chunked body is counted
as it streams in and the request fails with 413 as soon as the count passes the limit.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response
from service.errors import PayloadTooLarge


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of HTTP request body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.too_large = f"the body exceeds {max_bytes} bytes (OPML_MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value
            elif key == b"transfer-encoding":
                declared = b"chunked"  # counted as it streams, whatever a length says
                break
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await problem_response(PayloadTooLarge(self.too_large))(scope, receive, send)
                return
            # The HTTP parser delivers exactly Content-Length bytes: nothing to count.
            await self.app(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # an HTTPException passes FastAPI's body parsing unchanged -> 413 problem
                    raise HTTPException(413, self.too_large)
            return message

        await self.app(scope, counted, send)
