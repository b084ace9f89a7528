"""hybridjax.bench.stats: Student's t without scipy (its CDF through the regularized incomplete beta, its
quantile, at fractional degrees of freedom) and Satterthwaite's degrees of freedom."""

from __future__ import annotations

import math

import pytest

from hybridjax.bench import stats

# t(0.975, df) from printed tables (Abramowitz & Stegun 26.10; df = inf the normal's 1.959964).
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 10: 2.2281, 30: 2.0423, 120: 1.9799}


@pytest.mark.parametrize("df, t", sorted(T975.items()))
def test_the_quantile_matches_the_printed_tables(df, t):
  assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
  assert stats.t_quantile(0.025, df) == pytest.approx(-t, abs=1e-4)


def test_closed_forms_of_the_cdf_at_one_and_two_degrees_of_freedom():
  for t in (-3.0, -0.4, 0.0, 0.7, 2.0, 25.0):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_the_normal_is_the_limit_and_the_quantile_inverts_the_cdf_at_fractional_df():
  assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
  assert stats.t_cdf(1.0, 1e9) == pytest.approx(stats.t_cdf(1.0, math.inf), abs=1e-8)
  for df in (1.3, 2.5, 7.8, 46.2):
    for p in (0.6, 0.9, 0.975, 0.999):
      assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)
    q = stats.t_quantile(0.975, df)
    assert stats.t_two_sided_p(q, df) == pytest.approx(0.05, abs=1e-12)
    assert stats.t_quantile(0.975, df - 0.1) > q > stats.t_quantile(0.975, df + 0.1)  # fewer df, wider


def test_the_incomplete_beta_against_its_closed_forms():
  for x in (0.0, 0.01, 0.3, 0.77, 1.0):
    assert stats.incomplete_beta(1.0, 1.0, x) == pytest.approx(x, abs=1e-14)
    assert stats.incomplete_beta(2.5, 1.0, x) == pytest.approx(x**2.5, abs=1e-13)
    assert stats.incomplete_beta(1.0, 3.5, x) == pytest.approx(1 - (1 - x) ** 3.5, abs=1e-13)
    assert stats.incomplete_beta(0.5, 0.5, x) == pytest.approx(2 / math.pi * math.asin(math.sqrt(x)), abs=1e-12)


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


def test_bad_arguments_are_refused():
  for bad in (lambda: stats.t_quantile(1.0, 3), lambda: stats.t_quantile(0.5, 0), lambda: stats.t_cdf(1.0, -2)):
    with pytest.raises(ValueError):
      bad()
  with pytest.raises(ValueError, match="0 <= x <= 1"):
    stats.incomplete_beta(1.0, 1.0, 1.5)
