"""How much smaller the demo's per-row work is than the real model's: pure, so the page can say it exactly.

Row counts are never scaled (the gates look at rows); heads, head dim, top-k and the kv pool
are, because a 2-core CPU cannot run 16 heads x 512 lanes x top-k 2048 at serving rates.
"""

from __future__ import annotations

from dataclasses import dataclass

from .traffic import ModelSpec

FULL_KV_POOL = 65536  # slots: enough for top-k 2048 over long contexts without re-use


@dataclass(frozen=True, slots=True)
class ScaledShape:
    """The shape the demo launches for one model, beside the real one it stands for."""

    model: str
    heads: int
    nope_head_dim: int
    rope_head_dim: int
    topk: int
    kv_pool: int
    real: ModelSpec

    @property
    def head_dim(self) -> int:
        return self.nope_head_dim + self.rope_head_dim

    @property
    def work_per_row(self) -> int:
        """Multiply-adds per query row: QK over head_dim plus PV over the value lanes, per slot and head."""
        return self.heads * self.topk * (self.head_dim + self.nope_head_dim)

    @property
    def real_work_per_row(self) -> int:
        r = self.real
        return r.heads * r.topk * (r.head_dim + r.nope_head_dim)

    @property
    def factor(self) -> float:
        """real / demo work per row: 1.0 at full scale."""
        return self.real_work_per_row / self.work_per_row

    def describe(self) -> str:
        r = self.real
        if self.factor == 1.0:
            return f"{self.model}: full shape (heads {r.heads}, head dim {r.nope_head_dim}+{r.rope_head_dim}, top-k {r.topk})"
        return (
            f"{self.model}: heads {r.heads}->{self.heads}, head dim {r.nope_head_dim}+{r.rope_head_dim}"
            f"->{self.nope_head_dim}+{self.rope_head_dim}, top-k {r.topk}->{self.topk}, "
            f"kv pool {self.kv_pool} slots: per-row work 1/{self.factor:.0f} of the real model; rows per call unchanged"
        )


def scaled(spec: ModelSpec, *, full: bool, divisor: int = 8, topk: int = 32, kv_pool: int = 4096) -> ScaledShape:
    """The real shape (``full``) or one with heads and head dims / ``divisor`` and a small top-k."""
    if full:
        return ScaledShape(spec.name, spec.heads, spec.nope_head_dim, spec.rope_head_dim, spec.topk, FULL_KV_POOL, spec)
    if divisor < 1 or topk < 1 or kv_pool < topk:
        raise ValueError(f"bad scale: divisor {divisor}, top-k {topk}, kv pool {kv_pool}")
    return ScaledShape(
        spec.name,
        max(1, spec.heads // divisor),
        max(1, spec.nope_head_dim // divisor),
        spec.rope_head_dim // divisor,
        min(topk, spec.topk),
        kv_pool,
        spec,
    )
