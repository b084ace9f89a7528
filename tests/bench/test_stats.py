"""hybridjax.bench.stats: Satterthwaite's degrees of freedom, the part of the verdicts' statistics that
scipy.stats lacks (Student's t itself is scipy's)."""

from __future__ import annotations

import math

import pytest

from hybridjax.bench import stats


def test_satterthwaite_degrees_of_freedom():
  # One part: its own df. Two equal parts on 4 and inf df: twice 4. An eval error 1/3 of the seeds' adds a little.
  assert stats.satterthwaite_df([(0.01, 4)]) == pytest.approx(4)
  assert stats.satterthwaite_df([(0.01, 4), (0.01, math.inf)]) == pytest.approx(16)
  assert stats.satterthwaite_df([(0.009, 4), (0.003, 47)]) == pytest.approx(
    (0.009**2 + 0.003**2) ** 2 / (0.009**4 / 4 + 0.003**4 / 47)
  )
  assert stats.satterthwaite_df([(0.0, 4), (0.002, 47)]) == pytest.approx(47)
  assert stats.satterthwaite_df([(0.0, math.inf), (0.003, math.inf)]) == math.inf
  assert math.isnan(stats.satterthwaite_df([(0.0, 4), (0.0, 47)]))


def test_bad_degrees_of_freedom_are_refused():
  for df in (0, -2, math.nan):
    with pytest.raises(ValueError, match="degrees of freedom must be > 0"):
      stats.satterthwaite_df([(0.01, df)])
