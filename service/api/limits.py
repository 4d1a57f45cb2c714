"""Body-size limit, enforced before a large body is read.

A declared ``Content-Length`` over the limit is answered 413 at once; a chunked body is counted
as it streams in and the request fails with 413 as soon as the count passes the limit.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, problem_response


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of HTTP request body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the body exceeds {self.max_bytes} bytes (OPML_MAX_BODY_BYTES)"
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await problem_response(PayloadTooLarge(too_large))(scope, receive, send)
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # an HTTPException passes FastAPI's body parsing unchanged -> 413 problem
                    raise HTTPException(413, too_large)
            return message

        await self.app(scope, counted, send)
