"""A WSGI /metrics app that negotiates as the service does: protobuf with native histograms, the histogram mode.

prometheus_client's ``make_wsgi_app`` picks among its own text formats only, and its text 0.0.4 writer prints a
native-histogram sample as a plain sample named after the family. A rank's own /metrics server (the vLLM plugin's
per-rank ports) serves through this app instead, so a scraper there gets what ``routescope serve`` would give it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import Collector

from ..config import HistogramMode
from . import negotiate

__all__ = ["metrics_app"]


def metrics_app(collector: Collector, *, mode: HistogramMode | str = HistogramMode.BOTH) -> Callable[..., Iterable[bytes]]:
    """A WSGI callable answering GET/HEAD with ``collector``'s exposition for the request's Accept header."""
    mode = HistogramMode(mode)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET,HEAD"), ("Content-Length", "0")])
            return [b""]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET,HEAD"), ("Content-Length", "0")])
            return [b""]
        if environ.get("PATH_INFO", "/") == "/favicon.ico":
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        encoder, content_type = negotiate(environ.get("HTTP_ACCEPT"), mode=mode)
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        source = collector.restricted_registry(names) if names and hasattr(collector, "restricted_registry") else collector
        body = encoder(source)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b"" if method == "HEAD" else body]

    return app
