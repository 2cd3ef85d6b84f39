"""What a user may ask about: arch, rows and dtypes, with one set of bounds for every CLI and HTTP face. Pure.

Each check is a plain function that returns the normalised value or raises ``InputError`` with a
message naming the value; the pydantic types below wrap the same functions, so a typer command that
builds a model and a FastAPI endpoint that parses one refuse the same inputs with the same words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field

from .platform import KNOWN_ARCHS

MAX_ROWS = 2**31 - 1  # rows, thresholds and query lengths: int32's max, so int32 row offsets hold their sum
MAX_TOPK = 2**20
MAX_REQUESTS = 65536  # query_lens entries in one call
MAX_TENSOR_ROWS = 2**20  # commands that allocate the call's tensors (bench, sweep): q alone is 18.9 GB past it

DtypeName = Literal["bfloat16", "float16", "float32", "float8_e4m3fnuz", "float8_e4m3fn", "float8_e5m2",
                    "float8_e5m2fnuz"]
DTYPES: tuple[str, ...] = get_args(DtypeName)
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")  # what q and the output may be; kv may be fp8 too
FP8_DTYPES = tuple(d for d in DTYPES if d.startswith("float8"))


class InputError(ValueError):
    """A value outside what routescope accepts; every face turns it into exit status 2 or HTTP 422."""


def check_rows(value: int, *, minimum: int = 1, maximum: int = MAX_ROWS, what: str = "rows") -> int:
    """A row count (q.shape[0], a gate threshold, one request's length) inside [minimum, maximum]."""
    named = f"{what} " if what else ""  # "": the caller names the field (a flag, a query parameter)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{named}must be an integer; got {value!r}")
    if not minimum <= value <= maximum:
        raise InputError(f"{named}must be between {minimum} and {maximum}; got {value}")
    return value


def check_threshold(value: int, what: str = "threshold") -> int:
    """A gate's minimum rows: 0 (every call passes) up to MAX_ROWS."""
    return check_rows(value, minimum=0, what=what)


def check_topk(value: int, what: str = "topk") -> int:
    """Top-k slots per row: 1 up to MAX_TOPK."""
    return check_rows(value, maximum=MAX_TOPK, what=what)


def check_arch(value: str, *, allow_unknown: bool = False) -> str:
    """A known arch (any case, blanks trimmed); any other well-formed name only with ``allow_unknown``."""
    if not isinstance(value, str):
        raise InputError(f"arch must be a string; got {value!r}")
    arch = value.strip().lower()
    if not arch or len(arch) > 32 or not arch.replace("_", "").isalnum():
        raise InputError(f"arch must look like gfx942, gfx950 or sm90; got {value!r}")
    if arch not in KNOWN_ARCHS and not allow_unknown:
        raise InputError(f"arch {arch!r} is not one of {', '.join(KNOWN_ARCHS)}; --allow-unknown-arch "
                         "(allow_unknown_arch=true over HTTP) decides for it anyway, as a what-if platform "
                         "with no gate of its own")
    return arch


def check_dtype(value: str, allowed: Iterable[str] = DTYPES, what: str = "dtype") -> str:
    """A torch dtype name ("bfloat16", "torch.bfloat16" too) among ``allowed``."""
    allowed = tuple(allowed)
    name = str(value).strip().removeprefix("torch.")
    if name not in allowed:
        raise InputError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return name


def parse_rows_list(text: str, what: str = "rows", *, maximum: int = MAX_ROWS) -> tuple[int, ...]:
    """'1,2,16' -> (1, 2, 16): each a row count (check_rows), sorted, duplicates dropped."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise InputError(f"{what} needs at least one value; got {text!r}")
    values = set()
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise InputError(f"{what} takes comma-separated integers; {p!r} is not one") from None
        values.add(check_rows(v, maximum=maximum, what=f"{what} values"))
    return tuple(sorted(values))


def parse_query_lens(value: str | list[int] | None) -> list[int] | None:
    """"1,1,8000" -> [1, 1, 8000]; blanks ignored; each a row count, their sum too, at most MAX_REQUESTS."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            return None
        try:
            value = [int(p) for p in parts]
        except ValueError:
            raise InputError(f"query_lens must be comma-separated integers like 1,1,8000; got {value!r}") from None
    if not value:
        raise InputError("query_lens needs at least one request")
    if len(value) > MAX_REQUESTS:
        raise InputError(f"query_lens has more than {MAX_REQUESTS} requests")
    for n in value:
        check_rows(n, what="query_lens entries")
    check_rows(sum(value), what="rows (the sum of query_lens)")
    return list(value)


def _bounds(low: int, high: int) -> dict:
    return {"minimum": low, "maximum": high}  # documented in the JSON schema; enforced by the check itself


# The same checks as pydantic field types: a model using them is the CLI's and HTTP's one validation,
# and its messages are the plain functions' (the field's name is said by the face: a flag, a parameter).
Rows = Annotated[int, AfterValidator(lambda v: check_rows(v, what="")), Field(json_schema_extra=_bounds(1, MAX_ROWS))]
Threshold = Annotated[int, AfterValidator(lambda v: check_threshold(v, what="")),
                      Field(json_schema_extra=_bounds(0, MAX_ROWS))]
TopK = Annotated[int, AfterValidator(lambda v: check_topk(v, what="")), Field(json_schema_extra=_bounds(1, MAX_TOPK))]
QueryLen = Annotated[int, Field(json_schema_extra=_bounds(1, MAX_ROWS))]  # parse_query_lens checks the list
