"""compare_stats.py: the statistics of scripts/compare_modes.py, standard library only.

- mean_sd: mean and sample standard deviation (n - 1).
- t_quantile: quantiles of Student's t distribution, from its CDF through the regularized
  incomplete beta function (a continued fraction, evaluated with Lentz's method) inverted by
  bisection; exact to ~1e-10, no tables.
- paired: the per-seed differences a_s - b_s over the seeds both have, their mean, standard
  deviation and the two-sided t-interval of the mean (level 0.95 by default).
- verdict: the decision rule of docs/results.md ("Reduced-scale plan"), applied to one interval.
"""

import math  # lgamma, exp, log, sqrt, isfinite


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_sd(xs):
    """(mean, sample sd) of the finite values in xs; (None, None) without any, sd None for one."""
    xs = [x for x in xs if finite(x)]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _betacf(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = tiny if abs(d) < tiny else d
    d = 1.0 / d
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = tiny if abs(d) < tiny else d
        c = 1.0 + aa / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = tiny if abs(d) < tiny else d
        c = 1.0 + aa / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df > 0 degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p, df):
    """The t with P(T <= t) = p, 0 < p < 1 (bisection on t_cdf)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("t_quantile: need 0 < p < 1 and df > 0, got p=%r df=%r" % (p, df))
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def paired(a, b, level=0.95):
    """Per-seed differences of two {seed: value} maps over the seeds both have (finite values).

    Returns {"seeds", "diffs", "n", "mean", "sd", "t", "lo", "hi"}: the mean difference and its
    two-sided t-interval at `level` (None where n < 2)."""
    seeds = sorted(s for s in a if s in b and finite(a[s]) and finite(b[s]))
    diffs = [a[s] - b[s] for s in seeds]
    n = len(diffs)
    m, sd = mean_sd(diffs)
    out = {"seeds": seeds, "diffs": diffs, "n": n, "mean": m, "sd": sd, "t": None, "lo": None, "hi": None,
           "level": level}
    if n >= 2:
        t = t_quantile(0.5 + level / 2.0, n - 1)
        half = t * sd / math.sqrt(n)
        out.update(t=t, lo=m - half, hi=m + half)
    return out


def verdict(p, threshold):
    """The rule of docs/results.md for one paired interval [lo, hi] of a - b and a threshold > 0
    (the smallest difference that matters for that metric):

    - "gap seen": the interval excludes 0 (a - b > 0 throughout, or < 0 throughout);
    - "ruled out above X": the interval holds 0 and lies within [-threshold, +threshold]; X is
      max(|lo|, |hi|), the largest difference still compatible with the runs;
    - "undecided": the interval holds 0 and reaches past the threshold, or fewer than 2 seeds.
    Returns (verdict text, short code: "gap", "ruled_out", "undecided")."""
    if p["n"] < 2 or p["lo"] is None:
        return "undecided (%d paired seed%s; an interval needs 2)" % (p["n"], "" if p["n"] == 1 else "s"), "undecided"
    lo, hi = p["lo"], p["hi"]
    if lo > 0 or hi < 0:
        return "gap seen (%+.4g, %d%% interval [%+.4g, %+.4g])" % (p["mean"], round(100 * p["level"]), lo, hi), "gap"
    x = max(abs(lo), abs(hi))
    if x <= threshold:
        return "ruled out above %.3g (interval [%+.4g, %+.4g] within +-%g)" % (x, lo, hi, threshold), "ruled_out"
    return "undecided (interval [%+.4g, %+.4g] holds 0 and reaches past +-%g)" % (lo, hi, threshold), "undecided"


def moving_average(xs, window):
    """Trailing moving mean over `window` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out
