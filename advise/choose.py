"""Which latency tables price a traffic: the ones asked for, or the one that covers its platform, or none.

The CLI and the service both ask here, so the page and ``routescope advise`` rest on the same
table for the same traffic. A table of another device than the traffic's is a what-if and
says so; the demo off gfx942/sm90 opts into the H200 table with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from .sources import GENERATED
from .tables import LatencyTable, load_table
from .traffic import Traffic

DEFAULT_BY_ARCH = {"gfx942": "gfx942", "sm90": "h200"}
DEMO_TABLE = "h200"


@lru_cache(maxsize=16)
def cached_table(spec: str) -> LatencyTable:
    """A table loaded once per process (files are read again only for another spec)."""
    return load_table(spec)


def default_table(platform_arch: str, demo: bool) -> str | None:
    for arch, name in DEFAULT_BY_ARCH.items():
        if arch in platform_arch:
            return name
    return DEMO_TABLE if demo else None


def choose_tables(specs: Sequence[str], traffic: Traffic, *, loader=cached_table) -> tuple[list[LatencyTable], str]:
    """The tables to price ``traffic`` with, and a note for people when they are not of its own device."""
    arch = traffic.platform_arch
    generated = arch == GENERATED
    if not specs:
        name = default_table(arch, traffic.demo is not None or generated)
        if name is None:
            return [], (f"no latency table covers {arch}: no figure is given. Pass --table h200 or --table gfx942 "
                        "(or a sweep JSON) to price this traffic as if on that device; the report then says so")
        specs = [name]
    tables = [loader(s) for s in specs]
    device = tables[0].meta
    if device.arch == arch:
        note = "" if arch != "sm90" else (f"this sm90 traffic is priced with an {device.device}'s table ({device.name}); "
                                          "another sm90 GPU would time it differently")
        return tables, note
    if generated:
        return tables, f"generated demo traffic, priced as if on an {device.device} ({device.describe()}): a what-if"
    if traffic.demo is not None and not specs[1:] and specs[0] == DEMO_TABLE:
        return tables, (f"demo on {arch}: priced as if on an {device.device} ({device.describe()}), a what-if; "
                        f"nothing ran on an {device.device}")
    return tables, (f"the traffic ran on {arch}; priced as if on {device.device} ({device.describe()}): a what-if")
