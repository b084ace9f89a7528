"""What scipy.stats lacks for the verdicts (`protocol.verdict`) and the factor's intervals (`factor`):
Satterthwaite's degrees of freedom of a sum of variance estimates. Student's t itself is `scipy.stats.t`,
at any positive degrees of freedom (Satterthwaite's are fractional; math.inf is the normal)."""

from __future__ import annotations

import math


def satterthwaite_df(parts: list[tuple[float, float]]) -> float:
  """Welch-Satterthwaite degrees of freedom of a sum of independent variance estimates: `parts` is
  [(standard error, its degrees of freedom)], the df (se_total^4 / sum(se_i^4 / df_i)); a part whose
  df is math.inf adds nothing to the denominator. math.inf where every part with a non-zero error has
  infinite df; NaN where every error is zero (no spread to judge).

  Raises:
    ValueError: on a part with a non-zero error and degrees of freedom not > 0.
  """
  scale = max((se for se, _ in parts), default=0.0)
  if scale == 0:
    return math.nan
  # In units of the largest error: se^4 of a tiny error would underflow to 0 and read infinite df.
  total = sum((se / scale) ** 2 for se, _ in parts)
  denominator = 0.0
  for se, df in parts:
    if se > 0:
      if not df > 0:  # NaN too
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
      denominator += (se / scale) ** 4 / df  # 0.0 at infinite df
  return math.inf if denominator == 0 else total * total / denominator
