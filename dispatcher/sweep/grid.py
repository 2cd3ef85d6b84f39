"""What a sweep covers: kernels, head layouts, rows and top-k, parsed from the command line. Pure."""

from __future__ import annotations

from typing import NamedTuple

from ..pools import format_bytes, parse_bytes
from ..types import Kernel

# Every power of two from 1 to 16,384 rows: a table advise prices at any row count in between without a gap
# wider than 2x (advise/interp.py refuses to price across a wider one).
GPU_ROWS = tuple(1 << i for i in range(15))
GPU_TOPK = (128, 512, 2048)
# The kv pools a GPU sweep times by default, in bytes: one inside an H200's 60 MiB L2, one past it by over 4x
# (HBM-resident), and one of production size (a few GB of kv cache). The pool is a dimension of the table.
GPU_POOLS = (8 << 20, 256 << 20, 4 << 30)
CPU_ROWS = (1, 2, 16, 64)
CPU_TOPK = (64, 256)
# The "both head layouts": the two production layouts of docs/kernels.md, DSV4 (448+64) and GLM-5.3
# (512+0). DeepSeek V3.2's 576-lane layout (512+64, alias v32) is one `--layout` away.
DEFAULT_LAYOUTS = ("448+64", "512+0")
LAYOUT_ALIASES = {"dsv4": "448+64", "glm": "512+0", "v32": "512+64"}  # names `routescope explain` uses too
HEADS = 16
GPU_KERNELS = ("intree.ragged_prefill", "intree.sparse_decode")  # the preferred implementation: gluon on Hopper, else triton
CPU_KERNELS = ("intree.ragged_prefill:torch", "intree.sparse_decode:torch")


class SweepArgError(ValueError):
    """A command-line value the sweep cannot use; the CLI turns it into exit status 2."""


class Layout(NamedTuple):
    """Head layout: nope (latent) lanes + rope lanes; D is their sum."""

    nope: int
    rope: int

    @property
    def head_dim(self) -> int:
        return self.nope + self.rope

    def __str__(self) -> str:
        return f"{self.nope}+{self.rope}"


class KernelSpec(NamedTuple):
    """A kernel name and, optionally, which implementation of it (None: the registry's choice)."""

    kernel: Kernel
    impl: str | None = None

    def __str__(self) -> str:
        return f"{self.kernel.value}:{self.impl}" if self.impl else self.kernel.value


def parse_int_list(text: str, what: str, *, maximum: int = 1 << 20) -> tuple[int, ...]:
    """'1,2,16' -> (1, 2, 16): positive, at most ``maximum``, sorted, duplicates dropped."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SweepArgError(f"--{what} needs at least one value; got {text!r}")
    values = set()
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise SweepArgError(f"--{what} takes comma-separated integers; {p!r} is not one") from None
        if not 1 <= v <= maximum:
            raise SweepArgError(f"--{what} values must be between 1 and {maximum}; got {v}")
        values.add(v)
    return tuple(sorted(values))


def parse_layouts(text: str) -> tuple[Layout, ...]:
    """'512+64,glm' -> layouts; nope > 0, rope >= 0, D >= 16 (the tensor-core minimum)."""
    out: list[Layout] = []
    for p in (p.strip() for p in text.split(",")):
        if not p:
            continue
        p = LAYOUT_ALIASES.get(p.lower(), p)
        nope_s, plus, rope_s = p.partition("+")
        try:
            layout = Layout(int(nope_s), int(rope_s) if plus else 0)
        except ValueError:
            raise SweepArgError(f"--layout takes NOPE+ROPE pairs like 512+64; {p!r} is not one") from None
        if layout.nope <= 0 or layout.rope < 0 or layout.head_dim < 16 or layout.head_dim > 4096:
            raise SweepArgError(f"--layout {p}: need nope > 0, rope >= 0 and 16 <= D <= 4096")
        if layout not in out:
            out.append(layout)
    if not out:
        raise SweepArgError(f"--layout needs at least one NOPE+ROPE pair; got {text!r}")
    return tuple(out)


def parse_kernels(text: str, known_impls: dict[Kernel, list[str]]) -> tuple[KernelSpec, ...]:
    """'intree.ragged_prefill:triton,intree.sparse_decode' -> specs; the first two are A and B of the ratio."""
    specs: list[KernelSpec] = []
    names = {k.value: k for k in Kernel}
    for p in (p.strip() for p in text.split(",")):
        if not p:
            continue
        name, _, impl = p.partition(":")
        kernel = names.get(name)
        if kernel is None:
            raise SweepArgError(f"--kernels: unknown kernel {name!r}; known: {', '.join(names)}")
        impls = known_impls.get(kernel, [])
        if impl and impl not in impls:
            raise SweepArgError(f"--kernels: {name} has no implementation {impl!r}; it has: {', '.join(impls) or 'none'}")
        spec = KernelSpec(kernel, impl or None)
        if spec in specs:
            raise SweepArgError(f"--kernels: {p} is listed twice")
        specs.append(spec)
    if len(specs) < 2:
        raise SweepArgError(f"--kernels needs two or more kernels (A,B,...); got {text!r}")
    return tuple(specs)


def parse_pools(text: str) -> tuple[int, ...]:
    """'8MiB,256MiB,4GiB' -> pool sizes in bytes (sorted, duplicates dropped); SweepArgError naming the bad one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SweepArgError(f"--kv-pool needs at least one size; got {text!r}")
    out = set()
    for p in parts:
        try:
            out.add(parse_bytes(p))
        except ValueError as exc:
            raise SweepArgError(f"--kv-pool: {exc}") from None
    return tuple(sorted(out))


def pool_slots(pool_bytes: int, layout: Layout, kv_itemsize: int) -> int:
    """kv slots of a pool of ``pool_bytes`` at this layout and element size (at least one)."""
    return max(1, pool_bytes // (layout.head_dim * kv_itemsize))


def pool_names(pools: tuple[int, ...]) -> str:
    """(8388608, 268435456) -> '8MiB,256MiB': the --kv-pool value that repeats them."""
    return ",".join(format_bytes(p).replace(" ", "") for p in pools)


def default_kv_len(rows: int, topk: int) -> int:
    """KV pool size for a point: the call's own tokens (a fresh prompt), and never under 4x the fanout."""
    return max(rows, 4 * topk)
