"""Student's t distribution without scipy: its CDF (through the regularized incomplete beta function)
and its quantile, at any positive degrees of freedom (Satterthwaite's are fractional).

Pure Python (math only); the verdicts (`protocol.verdict`) and the factor's intervals (`factor`) read it.
"""

from __future__ import annotations

import math

# The continued fraction of the incomplete beta converges in a few dozen terms for the arguments a
# t CDF gives (Numerical Recipes, 3rd ed., 6.4); this bound only stops a runaway.
_MAX_TERMS = 500
_EPS = 1e-15
_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
  """The continued fraction of I_x(a, b) (modified Lentz), valid for x < (a + 1) / (a + b + 2)."""
  qab, qap, qam = a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > _TINY else _TINY)
  h = d
  for m in range(1, _MAX_TERMS + 1):
    m2 = 2 * m
    for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
      d = 1.0 + aa * d
      d = 1.0 / (d if abs(d) > _TINY else _TINY)
      c = 1.0 + aa / c
      c = c if abs(c) > _TINY else _TINY
      h *= d * c
    if abs(d * c - 1.0) < _EPS:
      return h
  raise ArithmeticError(f"the incomplete beta's continued fraction did not converge (a={a}, b={b}, x={x})")


def incomplete_beta(a: float, b: float, x: float) -> float:
  """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1.

  Raises:
    ValueError: outside that domain.
  """
  if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
    raise ValueError(f"incomplete_beta needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
  return _incomplete_beta(a, b, x, 1.0 - x)


def _incomplete_beta(a: float, b: float, x: float, y: float) -> float:
  """I_x(a, b) given x and y = 1 - x, each computed without cancellation by the caller (a t CDF's x sits
  within 1e-9 of 1 at large df, where 1 - x would keep a few digits)."""
  if x == 0.0 or y == 0.0:
    return 0.0 if x == 0.0 else 1.0
  front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y))
  if x < (a + 1.0) / (a + b + 2.0):
    return front * _beta_continued_fraction(a, b, x) / a
  return 1.0 - front * _beta_continued_fraction(b, a, y) / b


# Beyond this many degrees of freedom t is read as the normal: the incomplete beta's lgamma terms (each
# about df log df) cancel to a few digits there, while t and the normal differ by under 1e-8.
NORMAL_DF = 1e7


def _check_df(df: float) -> float:
  df = float(df)
  if not df > 0:  # NaN too
    raise ValueError(f"degrees of freedom must be > 0, got {df}")
  return df


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with `df` degrees of freedom (> 0, fractional; above `NORMAL_DF`, math.inf
  included, the normal)."""
  df, t = _check_df(df), float(t)
  if math.isnan(t):
    raise ValueError("t_cdf of NaN")
  if df > NORMAL_DF:
    return 0.5 * math.erfc(-t / math.sqrt(2.0))
  if math.isinf(t):
    return 1.0 if t > 0 else 0.0
  tail = 0.5 * _incomplete_beta(0.5 * df, 0.5, df / (df + t * t), t * t / (df + t * t))  # P(T > |t|)
  return 1.0 - tail if t > 0 else tail


def t_two_sided_p(t: float, df: float) -> float:
  """The two-sided p-value of a t statistic: P(|T| >= |t|)."""
  df, t = _check_df(df), abs(float(t))
  if df > NORMAL_DF:
    return math.erfc(t / math.sqrt(2.0))
  if math.isinf(t):
    return 0.0
  return _incomplete_beta(0.5 * df, 0.5, df / (df + t * t), t * t / (df + t * t))


def t_quantile(p: float, df: float) -> float:
  """The p-quantile of Student's t with `df` degrees of freedom (0 < p < 1), by bisection on `t_cdf`
  to float precision.

  Raises:
    ValueError: on p outside (0, 1) or df <= 0.
  """
  df, p = _check_df(df), float(p)
  if not 0.0 < p < 1.0:
    raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
  if p == 0.5:
    return 0.0
  if p < 0.5:
    return -t_quantile(1.0 - p, df)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < p:  # bracket: t grows as 1 / (1 - p)^(1 / df) in the tail
    lo, hi = hi, hi * 2.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if t_cdf(mid, df) < p:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def satterthwaite_df(parts: list[tuple[float, float]]) -> float:
  """Welch-Satterthwaite degrees of freedom of a sum of independent variance estimates: `parts` is
  [(standard error, its degrees of freedom)], the df (se_total^4 / sum(se_i^4 / df_i)); a part whose
  df is math.inf adds nothing to the denominator. math.inf where every part with a non-zero error has
  infinite df; NaN where every error is zero (no spread to judge)."""
  scale = max((se for se, _ in parts), default=0.0)
  if scale == 0:
    return math.nan
  # In units of the largest error: se^4 of a tiny error would underflow to 0 and read infinite df.
  total = sum((se / scale) ** 2 for se, _ in parts)
  denominator = 0.0
  for se, df in parts:
    if se > 0:
      denominator += (se / scale) ** 4 / _check_df(df) if not math.isinf(df) else 0.0
  return math.inf if denominator == 0 else total * total / denominator
