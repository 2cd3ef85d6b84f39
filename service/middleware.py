"""HTTP hardening as plain ASGI middleware: 414 for oversized URLs, HEAD wherever GET is, trusted Host names.

The Host check is Starlette's own ``TrustedHostMiddleware``; this module decides the default
list (loopback names when the service is bound to loopback, so a DNS-rebinding page cannot
read ``/routing`` through a browser) and adds the two small pieces Starlette lacks.
"""

from __future__ import annotations

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_URL_BYTES = 8192  # path + query string; longer answers 414 (nginx's default line buffer is 8 KiB)
MAX_HEAD_BYTES = 1 << 20  # uvicorn (h11) reads a request head this long, so a long URL reaches the 414
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
LOOPBACK_BINDS = ("127.0.0.1", "::1", "localhost")

__all__ = ["HeadAsGet", "MAX_HEAD_BYTES", "MAX_URL_BYTES", "TrustedHostMiddleware", "UrlTooLong", "default_hosts"]


def default_hosts(bind: str, configured: list[str] | None) -> list[str]:
    """The Host names to accept: the configured list, else loopback names when bound to loopback, else any."""
    if configured:
        return list(configured)
    return list(LOOPBACK_HOSTS) if bind in LOOPBACK_BINDS or bind.startswith("127.") else ["*"]


class UrlTooLong:
    """414 when the path and query string together exceed ``limit`` bytes: before any parsing or validation."""

    def __init__(self, app: ASGIApp, limit: int = MAX_URL_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
            if size > self.limit:
                body = f"URI too long: {size} bytes of path and query; at most {self.limit}\n".encode()
                await send({"type": "http.response.start", "status": 414,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class HeadAsGet:
    """HEAD runs the GET handler and sends its status and headers without the body (RFC 9110 9.3.2)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app(dict(scope, method="GET"), receive, headless)
