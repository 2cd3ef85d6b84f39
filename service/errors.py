"""422 bodies that name the parameter at fault, and a 500 that never leaks a traceback."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

log = logging.getLogger("routescope.service")


def _mentioned(msg: str, names: Iterable[str]) -> list[str]:
    """Field names a model-level message mentions ("give rows or query_lens" -> rows, query_lens)."""
    found = {n: m.start() for n in names if (m := re.search(rf"\b{re.escape(n)}\b", msg))}
    return sorted(found, key=found.get)


def describe_errors(errors: Sequence[dict], known: Iterable[str] = ()) -> tuple[str, list[dict]]:
    """(one line per error, FastAPI's items each with a ``parameter``): pure, so it is tested alone."""
    known = tuple(known)
    lines, items = [], []
    for err in errors:
        loc = [p if isinstance(p, (str, int)) else str(p) for p in err.get("loc", ())]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")  # the check's own words, as the CLI
        where = [str(p) for p in loc[1:]] if loc and loc[0] in ("query", "path", "header", "body") else [str(p) for p in loc]
        if where:
            param = where[0]
        else:
            param = ", ".join(_mentioned(msg, known)) or None
        lines.append(f"{'query parameter ' + param if param else 'request'}: {msg}")
        items.append({"loc": loc, "msg": msg, "type": str(err.get("type", "value_error")), "parameter": param})
    return "\n".join(lines), items


def validation_handler(known: Iterable[str]):
    """A RequestValidationError handler that knows the parameter names it may have to infer."""
    names = tuple(sorted(known, key=len, reverse=True))

    async def handle(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, items = describe_errors(exc.errors(), names)
        return JSONResponse(status_code=422, content=jsonable_encoder({"message": message, "detail": items}))

    return handle


async def unexpected_handler(request: Request, exc: Exception) -> JSONResponse:
    """A bug answers 500 with its class name only; the traceback goes to the log."""
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"message": f"internal error ({exc.__class__.__name__})"})
