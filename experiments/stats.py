"""Per-cell statistics, pure: mergeable moments, the ratio of mean kernel time B/A with an anytime-valid band, CUPED.

The band is the asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas ("Time-uniform
central limit theory and asymptotic confidence sequences", Annals of Statistics 2024, Theorem 2.2): Robbins' normal
mixture boundary applied to a mean with its variance estimated. For a mean of t terms with standard deviation sigma,

    mean +- sigma * sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * log(sqrt(t rho^2 + 1) / alpha))

holds at every t at once with probability >= 1 - alpha (asymptotically), so the band may be read at every flush and
the experiment stopped whenever it shows something. ``rho`` sets where the band is tightest (``T_OPT`` timed pairs).
The ratio's band is that band on log(mean B) - log(mean A), by the delta method: the k-th timed B call and the k-th
timed A call of a cell form the k-th term, t = min(timed A, timed B).

CUPED (Deng, Xu, Kohavi and Walker, WSDM 2013): where advise's table prices every timed call of a cell, each arm's
mean is adjusted by theta (mean covariate of the arm - mean covariate of both), theta pooled over both arms; the
covariate is the predicted time of the call under arm A, fixed before the arm is drawn, so the adjustment keeps the
estimate unbiased and removes the share of variance the prediction explains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05
T_OPT = 500  # timed pairs at which the band is tightest
MARGIN = 1.5  # calls_needed: the band must fit 1/MARGIN of the room between the ratio and 1


@dataclass(slots=True)
class Moments:
    """Count, means and centred sums of y (seconds) and x (the covariate) for one arm of one cell; mergeable."""

    n: int = 0
    mean_y: float = 0.0
    m2_y: float = 0.0
    nx: int = 0  # terms that had a covariate (CUPED needs every one)
    mean_x: float = 0.0
    m2_x: float = 0.0
    c_xy: float = 0.0

    def add(self, y: float, x: float | None = None) -> None:
        """Welford's update with one term; ``x`` None: no covariate for this call."""
        n = self.n + 1
        dy = y - self.mean_y
        self.mean_y += dy / n
        self.m2_y += dy * (y - self.mean_y)
        if x is not None:
            nx = self.nx + 1
            dx = x - self.mean_x
            self.mean_x += dx / nx
            self.m2_x += dx * (x - self.mean_x)
            self.c_xy += dx * (y - self.mean_y)
            self.nx = nx
        self.n = n

    def merge(self, other: Moments) -> Moments:
        """Chan, Golub and LeVeque's pairwise combination: the moments of both sets of terms."""
        if other.n == 0:
            return Moments(*self.as_tuple())
        if self.n == 0:
            return Moments(*other.as_tuple())
        n = self.n + other.n
        dy = other.mean_y - self.mean_y
        out = Moments(n, self.mean_y + dy * other.n / n, self.m2_y + other.m2_y + dy * dy * self.n * other.n / n)
        nx = self.nx + other.nx
        if nx:
            dx = other.mean_x - self.mean_x
            # the cross term pairs x and y over the same terms: exact when every term had a covariate
            w = self.nx * other.nx / nx if self.nx and other.nx else 0.0
            out.nx = nx
            out.mean_x = self.mean_x + dx * other.nx / nx
            out.m2_x = self.m2_x + other.m2_x + dx * dx * w
            out.c_xy = self.c_xy + other.c_xy + dx * dy * w
        return out

    def as_tuple(self) -> tuple:
        return (self.n, self.mean_y, self.m2_y, self.nx, self.mean_x, self.m2_x, self.c_xy)

    @classmethod
    def of(cls, values: list | tuple) -> Moments:
        return cls(int(values[0]), *(float(v) for v in values[1:3]), int(values[3]), *(float(v) for v in values[3 + 1:]))


def mixture_halfwidth(t: int, sigma: float, alpha: float = ALPHA, t_opt: int = T_OPT) -> float:
    """Half-width of the two-sided normal-mixture confidence sequence for a mean of ``t`` terms."""
    rho2 = rho_squared(t_opt, alpha)
    v = t * rho2 + 1.0
    return sigma * math.sqrt(2.0 * v / (t * t * rho2) * math.log(math.sqrt(v) / alpha))


def rho_squared(t_opt: int, alpha: float = ALPHA) -> float:
    """The mixing variance that makes the band narrowest at ``t_opt`` terms (Waudby-Smith et al., eq. for rho)."""
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / t_opt


@dataclass(frozen=True, slots=True)
class Ratio:
    """B/A of mean kernel time with its band (None where too few terms), and whether CUPED adjusted it."""

    ratio: float | None
    low: float | None
    high: float | None
    mean_a: float | None
    mean_b: float | None
    pairs: int
    cuped: bool
    stat_low: float | None = None  # the statistical band alone, before the clock's bound widens it
    stat_high: float | None = None


NO_RATIO = Ratio(None, None, None, None, None, 0, False)


def widen(low: float, high: float, mean_a: float, bound_a: float, bound_b: float) -> tuple[float, float]:
    """The band on B/A of true kernel time, from the band on B/A of the readings and each arm's clock bound: interval
    arithmetic on the arms' means (each reading may lie up to its bound off the kernel's time, the same way for a
    whole arm, so a mean may too). The high end is infinite where A's bound reaches its mean."""
    if bound_a <= 0.0 and bound_b <= 0.0:
        return low, high
    lo = max(low * mean_a - bound_b, 0.0) / (mean_a + bound_a)
    hi = (high * mean_a + bound_b) / (mean_a - bound_a) if mean_a > bound_a else math.inf
    return lo, hi


def _cuped(a: Moments, b: Moments) -> tuple[float, float, float, float] | None:
    """(mean A, mean B, var A, var B) adjusted by the pooled theta, or None when the covariate cannot be used."""
    if a.nx != a.n or b.nx != b.n or a.m2_x + b.m2_x <= 0.0:
        return None
    theta = (a.c_xy + b.c_xy) / (a.m2_x + b.m2_x)
    mean_x = (a.mean_x * a.n + b.mean_x * b.n) / (a.n + b.n)
    out = []
    for m in (a, b):
        out.append(m.mean_y - theta * (m.mean_x - mean_x))
    var = [max((m.m2_y - 2.0 * theta * m.c_xy + theta * theta * m.m2_x) / (m.n - 1), 0.0) for m in (a, b)]
    return out[0], out[1], var[0], var[1]


def _arms(a: Moments, b: Moments, cuped: bool) -> tuple[float, float, float, float, bool]:
    """(mean A, mean B, variance A, variance B, CUPED used) of one cell."""
    adjusted = _cuped(a, b) if cuped and a.n > 1 and b.n > 1 else None
    if adjusted is not None and adjusted[0] > 0.0 and adjusted[1] > 0.0:
        return (*adjusted, True)
    var_a = a.m2_y / (a.n - 1) if a.n > 1 else 0.0
    var_b = b.m2_y / (b.n - 1) if b.n > 1 else 0.0
    return a.mean_y, b.mean_y, var_a, var_b, False


def boundary(t: int, alpha: float = ALPHA, t_opt: int = T_OPT) -> float:
    """The band's half-width in standard errors at ``t`` terms: ``mixture_halfwidth`` with sigma = sqrt(t)."""
    return mixture_halfwidth(t, math.sqrt(t), alpha, t_opt)


def pooled(cells: list[tuple], *, alpha: float = ALPHA, t_opt: int = T_OPT) -> Ratio:
    """B/A of total kernel time over (calls, A moments, B moments[, A's clock bound, B's]) cells: the
    traffic-weighted ratio of one rows bucket across models and call classes, with a band widened by the clocks'
    bounds (weighted alike). Cells with fewer than two timed pairs are left out; the band uses the widest boundary of
    the smallest and the summed pair counts (the boundary is not monotone in t)."""
    used = [(c[0], c[1], c[2], *(c[3:5] if len(c) >= 5 else (0.0, 0.0))) for c in cells
            if min(c[1].n, c[2].n) >= 2 and c[1].mean_y > 0.0 and c[2].mean_y > 0.0 and c[0] > 0]
    if not used:
        return NO_RATIO
    total_a = total_b = var_a = var_b = bound_a = bound_b = 0.0
    any_cuped = False
    pairs = []
    for w, a, b, ba, bb in used:
        bound_a += w * ba
        bound_b += w * bb
        mean_a, mean_b, va, vb, c = _arms(a, b, True)
        any_cuped |= c
        total_a += w * mean_a
        total_b += w * mean_b
        var_a += w * w * va / a.n
        var_b += w * w * vb / b.n
        pairs.append(min(a.n, b.n))
    r = total_b / total_a
    se = math.sqrt(var_b / (total_b * total_b) + var_a / (total_a * total_a))
    z = max(boundary(min(pairs), alpha, t_opt), boundary(sum(pairs), alpha, t_opt))
    log_r = math.log(r)
    low, high = math.exp(log_r - z * se), math.exp(log_r + z * se)
    wide = widen(low, high, total_a, bound_a, bound_b)
    return Ratio(r, *wide, total_a, total_b, sum(pairs), any_cuped, low, high)


def ratio(a: Moments, b: Moments, *, alpha: float = ALPHA, t_opt: int = T_OPT, cuped: bool = True,
          bound_a: float = 0.0, bound_b: float = 0.0) -> Ratio:
    """The cell's B/A ratio of mean kernel time and its anytime-valid band at level 1 - ``alpha``, widened by each
    arm's clock bound (seconds: the most its readings may lie off the kernels' time, ``widen``)."""
    if a.n == 0 or b.n == 0 or a.mean_y <= 0.0 or b.mean_y <= 0.0:
        return NO_RATIO
    mean_a, mean_b, var_a, var_b, used = _arms(a, b, cuped)
    r = mean_b / mean_a
    t = min(a.n, b.n)
    if t < 2:
        return Ratio(r, None, None, mean_a, mean_b, t, used)
    # delta method on log(mean B) - log(mean A); sigma is per term of t pairs
    sigma = math.sqrt(t * (var_b / (b.n * mean_b * mean_b) + var_a / (a.n * mean_a * mean_a)))
    half = mixture_halfwidth(t, sigma, alpha, t_opt)
    log_r = math.log(r)
    low, high = math.exp(log_r - half), math.exp(log_r + half)
    return Ratio(r, *widen(low, high, mean_a, bound_a, bound_b), mean_a, mean_b, t, used, low, high)


@dataclass(frozen=True, slots=True)
class Saving:
    """Seconds B would have saved over the eligible traffic seen (negative: cost), with a band; all three None while
    no cell has a ratio (nothing measured is not a saving of zero)."""

    seconds: float | None
    low: float | None
    high: float | None


def saving(cells: list[tuple], *, alpha: float = ALPHA, t_opt: int = T_OPT) -> Saving:
    """Over (eligible calls, A moments, B moments[, A's clock bound, B's]) per cell: sum of calls x mean A x
    (1 - ratio).

    The band holds for all cells together: each cell's ratio band is taken at alpha / cells (Bonferroni); a cell
    with no band yet contributes its estimate to ``seconds`` and nothing certain to the band (its full A time
    either way, from -calls x mean A x 9 to +calls x mean A). No cell with a ratio (no timed call in an arm
    yet): unknown, every field None.
    """
    k = max(len(cells), 1)
    seconds = low = high = 0.0
    measured = 0
    for cell in cells:
        calls, a, b = cell[:3]
        ba, bb = cell[3:5] if len(cell) >= 5 else (0.0, 0.0)
        r = ratio(a, b, alpha=alpha / k, t_opt=t_opt, bound_a=ba, bound_b=bb)
        if r.ratio is None or r.mean_a is None:
            continue
        base = calls * r.mean_a
        measured += 1
        seconds += base * (1.0 - r.ratio)
        if r.low is None or r.high is None:
            low += base * (1.0 - 10.0)
            high += base
        else:
            low += base * (1.0 - min(r.high, 10.0))
            high += base * (1.0 - r.low)
    if not measured:
        return Saving(None, None, None)
    return Saving(seconds, low, high)


def crossover(cells: list[tuple[int, int | None, float | None, float | None]], *, below: bool) -> int | None:
    """The measured crossover from moved rows buckets given as (lo rows, hi rows exclusive, ratio high, ratio).

    ``below`` False (a gate: B takes calls from the gate up): the smallest lower edge from which every moved
    bucket's band lies at or below 1. ``below`` True (split_below_N: B takes calls under N): the largest upper edge
    under which every moved bucket's band lies at or below 1, counted from the bottom. None: no bucket qualifies.
    """
    ordered = sorted(cells, key=lambda c: c[0])
    if below:
        edge = None
        for lo, hi, high, _ in ordered:
            if high is None or high > 1.0:
                break
            edge = hi
        return edge
    edge = None
    for lo, _, high, _ in reversed(ordered):
        if high is None or high > 1.0:
            break
        edge = lo
    return edge


def calls_needed(r: Ratio, calls: int, timed_calls: int, *, alpha: float = ALPHA, t_opt: int = T_OPT,
                 most: int = 10**12) -> tuple[int | None, str]:
    """About how many calls a bucket holding ``calls`` (``timed_calls`` of them in cells with a band) needs, at the
    same fraction, for its band to clear 1 with room to spare (``MARGIN``) if the ratio stays where it is: (calls,
    why); most runs that long decide. The spread per timed pair
    is read off the statistical band; the clock's share of the band does not shrink with calls, so a ratio within
    it of 1 needs a better clock, not more calls (None)."""
    if r.ratio is None or r.stat_low is None or r.stat_high is None or r.pairs < 2 or calls <= 0:
        return None, "too few timed calls for a spread: wait for more"
    log_r = math.log(r.ratio)
    if log_r == 0.0:
        return None, "the ratio is 1: no number of calls decides it"
    clock_share = math.log(r.high / r.stat_high) if log_r < 0 else math.log(r.stat_low / r.low)
    room = abs(log_r) - clock_share
    if room <= 0.0 or not math.isfinite(room):
        return None, "within the clock's bound of 1: more calls cannot decide it"
    room /= MARGIN  # the ratio seen is itself noisy: leave it room to move and still decide
    sigma = math.log(r.stat_high / r.ratio) / mixture_halfwidth(r.pairs, 1.0, alpha, t_opt)
    t = r.pairs
    while t < most and mixture_halfwidth(t, sigma, alpha, t_opt) > room:
        t *= 2
    if t >= most:
        return None, "more calls than any run holds"
    lo, hi = t // 2, t
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if mixture_halfwidth(mid, sigma, alpha, t_opt) > room:
            lo = mid
        else:
            hi = mid
    per_pair = max(timed_calls, 1) / r.pairs
    return int(math.ceil(hi * per_pair)), "estimate at this fraction, if the ratio holds"
