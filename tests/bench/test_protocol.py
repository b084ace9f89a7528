"""hybridjax.bench.protocol: the monotone envelope, steps to reach a loss, the ratio and its aggregates."""

from __future__ import annotations

import math

import chex
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hybridjax.bench import protocol
from hybridjax.bench.protocol import Reach

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def curves(draw, min_size: int = 1, max_size: int = 8, shuffle: bool = True):
  """(budgets, losses): distinct positive budgets (consecutive ratios >= 1.05) and losses in [0.1, 10]."""
  n = draw(st.integers(min_size, max_size))
  b0 = draw(st.floats(1.0, 1000.0))
  ratios = draw(st.lists(st.floats(1.05, 4.0), min_size=n - 1, max_size=n - 1))
  budgets = [b0]
  for r in ratios:
    budgets.append(budgets[-1] * r)
  losses = draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
  if shuffle:
    order = draw(st.permutations(range(n)))
    budgets = [budgets[i] for i in order]
    losses = [losses[i] for i in order]
  return budgets, losses


@st.composite
def close_curves(draw, min_size: int = 2, max_size: int = 6):
  """(budgets, losses) ascending whose consecutive losses often differ by a few float roundings
  (`protocol.rounding`), up or down, among ordinary drops: the curves where rounding decides."""
  n = draw(st.integers(min_size, max_size))
  budgets = [draw(st.floats(1.0, 1000.0))]
  losses = [draw(st.floats(0.1, 10.0))]
  for _ in range(n - 1):
    budgets.append(budgets[-1] * draw(st.floats(1.05, 4.0)))
    c = draw(st.one_of(st.floats(-6.0, 6.0), st.floats(6.0, 1e5)))  # in roundings (1e-6 of the loss)
    losses.append(losses[-1] * (1.0 - c * protocol.ROUNDING))
  return budgets, losses


def _target(data, env: np.ndarray) -> float:
  """A target loss: inside, slightly outside, or exactly on the envelope (hits its flat stretches)."""
  span = max(env[0] - env[-1], 0.1)
  return data.draw(
    st.one_of(
      st.floats(-0.2, 1.2).map(lambda u: float(env[-1] + u * span)),
      st.sampled_from([float(e) for e in env]),
    )
  )


# --- the envelope ---------------------------------------------------------------------------------


@SETTINGS
@given(curves())
def test_envelope_is_non_increasing_and_never_above_the_input(curve):
  budgets, losses = curve
  b, env = protocol.monotone_envelope(budgets, losses)
  assert np.all(np.diff(b) > 0)
  assert np.all(np.diff(env) <= 0)
  given_loss = dict(zip(budgets, losses))
  assert sorted(given_loss) == b.tolist()
  for bi, ei in zip(b, env):
    assert ei <= given_loss[bi]
  assert env[0] == given_loss[b[0]]  # the smallest budget has nothing before it
  assert env[-1] == min(losses)


@SETTINGS
@given(curves(shuffle=False))
def test_envelope_is_the_identity_on_a_non_increasing_curve(curve):
  budgets, losses = curve
  losses = sorted(losses, reverse=True)
  b, env = protocol.monotone_envelope(budgets, losses)
  assert b.tolist() == budgets
  assert env.tolist() == losses


# --- steps to reach a loss ------------------------------------------------------------------------


@SETTINGS
@given(curves(), st.data())
def test_steps_to_reach_is_inside_the_budgets_and_inverts_curve_loss_at(curve, data):
  budgets, losses = curve
  b, env = protocol.monotone_envelope(budgets, losses)
  target = _target(data, env)
  reach = protocol.steps_to_reach(budgets, losses, target)
  if target > env[0] + protocol.rounding(env[0]):
    assert reach == Reach(float(b[0]), False, True)  # the smallest budget already does better
    return
  assert reach.steps is not None
  assert b[0] <= reach.steps <= b[-1]
  kb, ke, _ = protocol.reading_knots(budgets, losses)
  if target < ke[-1] - protocol.rounding(ke[-1]):
    assert reach == Reach(float(kb[-1]), True)  # the last drop: the largest budget unless the end is flat
    return
  assert not reach.lower_bound and not reach.upper_bound
  # The inverse up to float rounding (a target that close to a knot reads the knot).
  back = protocol.curve_loss_at(budgets, losses, reach.steps)
  assert abs(back - target) <= protocol.rounding(max(back, target)) * (1 + 1e-9) + 1e-15
  # Reached where first reached: any smaller budget on the curve is still above the target, up to rounding.
  assert np.all(env[b < reach.steps] > target - 2 * protocol.rounding(env[0]))


@SETTINGS
@given(curves(), st.data())
def test_steps_to_reach_is_monotone_in_the_target(curve, data):
  budgets, losses = curve
  _, env = protocol.monotone_envelope(budgets, losses)
  t1, t2 = sorted([_target(data, env), _target(data, env)])
  r1 = protocol.steps_to_reach(budgets, losses, t1)  # the lower target
  r2 = protocol.steps_to_reach(budgets, losses, t2)
  assert r1.steps is not None and r2.steps is not None  # finite targets: reached or a bound
  assert r1.steps >= r2.steps  # a lower target never needs fewer steps
  if r2.lower_bound:
    assert r1.lower_bound
  if r1.upper_bound:
    assert r2.upper_bound


def test_steps_to_reach_lower_bound_not_reached_and_edges():
  budgets, losses = [1000, 100], [2.0, 3.0]  # given out of order on purpose
  assert protocol.steps_to_reach(budgets, losses, 1.0) == Reach(1000.0, True)  # below the curve's end
  assert protocol.steps_to_reach(budgets, losses, 3.5) == Reach(100.0, False, True)  # above its start: <= 100
  assert protocol.steps_to_reach(budgets, losses, 3.0) == Reach(100.0, False)  # exactly the start
  assert protocol.steps_to_reach(budgets, losses, 2.0) == Reach(1000.0, False)  # exactly the end
  assert protocol.steps_to_reach(budgets, losses, float("nan")) == Reach(None, False)
  assert protocol.steps_to_reach(budgets, losses, float("inf")) == Reach(None, False)  # a diverged run
  assert protocol.steps_to_reach(budgets, losses, float("-inf")) == Reach(1000.0, True)
  # A single budget: reached only at its own loss.
  assert protocol.steps_to_reach([50], [1.0], 1.0) == Reach(50.0, False)
  assert protocol.steps_to_reach([50], [1.0], 0.5) == Reach(50.0, True)
  assert protocol.steps_to_reach([50], [1.0], 1.5) == Reach(50.0, False, True)


def test_log_linear_interpolation_hand_example():
  reach = protocol.steps_to_reach([1000, 4000], [2.0, 1.0], 1.5)
  assert reach.lower_bound is False
  # Half-way in log(steps) (linear in steps gives 2500), from band edge to band edge: the knots' losses
  # less and plus their float rounding (1e-6 of each), 2 - 2e-6 and 1 + 1e-6.
  frac = lambda t: (2 - 2e-6 - t) / (1 - 3e-6)  # noqa: E731
  assert reach.steps == pytest.approx(1000 * 4 ** frac(1.5), rel=1e-12)
  assert reach.steps == pytest.approx(2000.0, rel=1e-5)
  assert protocol.curve_loss_at([1000, 4000], [2.0, 1.0], 2000) == pytest.approx(1.5, rel=1e-12)
  assert protocol.steps_to_reach([1000, 4000], [2.0, 1.0], 1.75).steps == pytest.approx(
    1000 * 4 ** frac(1.75), rel=1e-12
  )
  assert protocol.steps_to_reach([1000, 4000], [2.0, 1.0], 1.75).steps == pytest.approx(1000 * 2**0.5, rel=1e-5)


def test_flat_stretches_are_read_from_their_first_budget():
  budgets = [10, 100, 1000, 10000]
  # The envelope of [4, 2, 3, 1] is [4, 2, 2, 1]: the loss 3 at 1000 steps is credited with 2, and the
  # curve is read between the envelope's drops (10, 100, 10000): 1000 is no point of its own.
  _, env = protocol.monotone_envelope(budgets, [4.0, 2.0, 3.0, 1.0])
  assert env.tolist() == [4.0, 2.0, 2.0, 1.0]
  kb, ke, last = protocol.reading_knots(budgets, [4.0, 2.0, 3.0, 1.0])
  assert kb.tolist() == [10.0, 100.0, 10000.0] and ke.tolist() == [4.0, 2.0, 1.0] and last == 10000.0
  assert protocol.steps_to_reach(budgets, [4.0, 2.0, 3.0, 1.0], 2.0) == Reach(100.0, False)
  # (Up to the knots' rounding bands, 1e-6 of each loss: `test_log_linear_interpolation_hand_example`.)
  assert protocol.steps_to_reach(budgets, [4.0, 2.0, 3.0, 1.0], 2.5).steps == pytest.approx(10 * 10**0.75, rel=1e-5)
  # Below the flat stretch: interpolate from its first budget (100) to the next drop (10000), half-way.
  assert protocol.steps_to_reach(budgets, [4.0, 2.0, 3.0, 1.0], 1.5).steps == pytest.approx(1000.0, rel=1e-5)
  assert protocol.curve_loss_at(budgets, [4.0, 2.0, 3.0, 1.0], 1000) == pytest.approx(1.5)
  assert protocol.curve_loss_at(budgets, [4.0, 2.0, 3.0, 1.0], 500) == pytest.approx(2.0 - math.log10(5) / 2)
  # A flat stretch at the curve's end: reached at its first budget, a hair below it (float rounding) too,
  # and further below it a lower bound there (1000 steps did worse than 100: reading 1000 would make a
  # small difference a 10x jump).
  assert protocol.steps_to_reach([10, 100, 1000], [2.0, 1.0, 1.5], 1.0) == Reach(100.0, False)
  assert protocol.steps_to_reach([10, 100, 1000], [2.0, 1.0, 1.5], 1.0 - 1e-9) == Reach(100.0, False)
  assert protocol.steps_to_reach([10, 100, 1000], [2.0, 1.0, 1.5], 1.0 - 1e-4) == Reach(100.0, True)
  # A "drop" within float rounding is a flat stretch: an arm a rounding error below the anchor at 10
  # steps reads 10 (1.00x), not a lower bound at the curve's end (a 2e-16 drop once read 10x).
  assert protocol.reading_knots([10, 100], [1.0500000000000003, 1.05])[0].tolist() == [10.0]
  assert protocol.steps_to_reach([10, 100], [1.0500000000000003, 1.05], 1.05 - 2e-7) == Reach(10.0, False)
  assert protocol.steps_to_reach([10, 100, 1000], [2.0, 1.0, 0.5], 0.4) == Reach(1000.0, True)
  assert protocol.curve_loss_at([10, 100, 1000], [2.0, 1.0, 1.5], 500) == 1.0


def test_curve_loss_at_reads_the_envelope_and_is_none_outside():
  budgets, losses = [10, 100, 1000], [3.0, 4.0, 1.0]
  assert protocol.curve_loss_at(budgets, losses, 9.999) is None
  assert protocol.curve_loss_at(budgets, losses, 1000.001) is None
  assert protocol.curve_loss_at(budgets, losses, float("nan")) is None
  assert protocol.curve_loss_at(budgets, losses, 10) == 3.0
  # 100 steps did worse than 10 (the envelope is flat there): the curve runs from 10 to 1000, so it reads
  # 2.0 at 100, below the envelope's 3.0 and the raw 4.0.
  assert protocol.curve_loss_at(budgets, losses, 100) == pytest.approx(2.0)
  assert protocol.curve_loss_at(budgets, losses, 1000) == 1.0
  assert protocol.curve_loss_at(budgets, losses, math.sqrt(100 * 1000)) == pytest.approx(1.5)


# --- the ratio ------------------------------------------------------------------------------------


@SETTINGS
@given(curves(min_size=2), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_ratio_is_above_one_only_when_the_method_is_below_the_curve(curve, u_cost, u_loss):
  budgets, losses = curve
  b, env = protocol.monotone_envelope(budgets, losses)
  cost = float(min(max(b[0] * (b[-1] / b[0]) ** u_cost, b[0]), b[-1]))
  loss = float(env[-1] + u_loss * (env[0] - env[-1]))
  reach = protocol.steps_to_reach(budgets, losses, loss)
  assume(reach.steps is not None and not reach.lower_bound)
  curve_loss = protocol.curve_loss_at(budgets, losses, cost)
  assert curve_loss is not None
  # leave out ties within float rounding, which `steps_to_reach` reads as reached at the knot
  assume(abs(curve_loss - loss) > 2 * protocol.rounding(max(curve_loss, loss)))
  r = protocol.ratio(reach, cost)
  assert (r["value"] > 1) == (curve_loss > loss)


def test_ratio_fields_and_bad_cost():
  assert protocol.ratio(Reach(2000.0, False), 500) == {
    "value": 4.0,
    "lower_bound": False,
    "upper_bound": False,
    "baseline_steps": 2000.0,
    "method_cost": 500.0,
  }
  r = protocol.ratio(Reach(100.0, False, True), 200)
  assert r["value"] == 0.5 and r["upper_bound"] is True and r["lower_bound"] is False
  r = protocol.ratio(Reach(1000.0, True), 250)
  assert r["value"] == 4.0 and r["lower_bound"] is True
  r = protocol.ratio(Reach(None, False), 250)
  assert r["value"] is None and r["baseline_steps"] is None and r["lower_bound"] is False
  for bad in (0, -1.0, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="method_cost must be a positive"):
      protocol.ratio(Reach(1000.0, False), bad)


# --- aggregates -----------------------------------------------------------------------------------


def test_summarize_counts_nulls_and_lower_bounds():
  ratios = [
    protocol.ratio(Reach(2000.0, False), 1000),  # 2.0
    protocol.ratio(Reach(None, False), 1000),  # null
    protocol.ratio(Reach(4000.0, True), 1000),  # 4.0, a lower bound: enters the mean as is
    protocol.ratio(Reach(3000.0, False), 1000),  # 3.0
  ]
  s = protocol.summarize(ratios)
  assert s["n"] == 4 and s["n_null"] == 1 and s["n_lower_bound"] == 1
  assert s["values"] == [2.0, None, 4.0, 3.0]
  assert s["mean"] == pytest.approx(3.0)
  assert s["std"] == pytest.approx(1.0)
  one = protocol.summarize(ratios[:2])
  assert one["mean"] == 2.0 and one["std"] is None
  none = protocol.summarize(ratios[1:2])
  assert none["mean"] is None and none["std"] is None and none["n_null"] == 1
  assert protocol.summarize([])["n"] == 0


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["reached", "lower", "null"]), st.floats(1.0, 1e5)), max_size=10))
def test_summarize_matches_a_direct_count(seeds):
  reaches = {
    "reached": lambda s: Reach(s, False),
    "lower": lambda s: Reach(s, True),
    "null": lambda s: Reach(None, False),
  }
  ratios = [protocol.ratio(reaches[kind](s), 100.0) for kind, s in seeds]
  s = protocol.summarize(ratios)
  present = [steps / 100.0 for kind, steps in seeds if kind != "null"]
  assert s["n"] == len(seeds)
  assert s["n_null"] == sum(kind == "null" for kind, _ in seeds)
  assert s["n_lower_bound"] == sum(kind == "lower" for kind, _ in seeds)
  assert [v for v in s["values"] if v is not None] == pytest.approx(present)
  if present:
    assert s["mean"] == pytest.approx(np.mean(present))
  else:
    assert s["mean"] is None
  if len(present) >= 2:
    assert s["std"] == pytest.approx(np.std(present, ddof=1))
  else:
    assert s["std"] is None


def test_mean_std():
  assert protocol.mean_std([1.0, 2.0, 3.0]) == pytest.approx([2.0, 1.0])
  assert protocol.mean_std([5.0]) == [5.0, 0.0]
  with pytest.raises(ValueError, match="empty"):
    protocol.mean_std([])


def test_paired_difference_verdicts():
  rng = np.random.default_rng(0)
  b = rng.normal(3.0, 0.5, size=8)
  noise = rng.normal(0.0, 0.01, size=8)
  lower = protocol.paired_difference(b - 0.2 + noise, b)
  assert lower["verdict"] == "lower" and lower["mean"] == pytest.approx(-0.2, abs=0.02)
  assert lower["n"] == 8 and len(lower["differences"]) == 8
  assert lower["se"] == pytest.approx(lower["std"] / math.sqrt(8))
  assert protocol.paired_difference(b + 0.2 + noise, b)["verdict"] == "higher"
  # Symmetric noise around zero: the mean difference is 0 and the se is not.
  sym = protocol.paired_difference(b + np.array([0.3, -0.3, 0.1, -0.1, 0.2, -0.2, 0.05, -0.05]), b)
  assert sym["verdict"] == "no difference" and sym["mean"] == pytest.approx(0.0, abs=1e-12)
  # Exactly equal: se == 0 and mean == 0.
  assert protocol.paired_difference([1.0, 2.0], [1.0, 2.0])["verdict"] == "no difference"
  # A constant shift has se == 0 and a non-zero mean.
  assert protocol.paired_difference([2.0, 3.0], [1.0, 2.0])["verdict"] == "higher"
  # A shift hidden in the noise (|mean| < t(0.975, 2) se).
  assert protocol.paired_difference([1.1, 0.0, 2.0], [1.0, 1.0, 1.0])["verdict"] == "no difference"


@SETTINGS
@given(st.lists(st.tuples(st.floats(-10, 10), st.floats(-10, 10)), min_size=2, max_size=10))
def test_paired_difference_is_antisymmetric(pairs):
  a, b = [p[0] for p in pairs], [p[1] for p in pairs]
  ab, ba = protocol.paired_difference(a, b), protocol.paired_difference(b, a)
  flip = {"lower": "higher", "higher": "lower", "no difference": "no difference"}
  assert ba["verdict"] == flip[ab["verdict"]]
  assert ba["mean"] == pytest.approx(-ab["mean"], abs=1e-12)
  assert ba["se"] == pytest.approx(ab["se"], abs=1e-12)
  if ab["verdict"] != "no difference":  # beyond t(0.975, df) standard errors (`protocol.verdict`)
    assert ab["rule"] == protocol.RULE and ab["p"] <= 0.05
    assert ab["se_total"] == 0 or abs(ab["mean"]) > ab["t_crit"] * ab["se_total"]


def test_paired_difference_rejects_bad_input():
  with pytest.raises(ValueError, match="mismatched lengths"):
    protocol.paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="at least 2 pairs"):
    protocol.paired_difference([1.0], [2.0])
  with pytest.raises(ValueError, match="finite"):
    protocol.paired_difference([1.0, float("nan")], [2.0, 3.0])


# --- bad curves -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "budgets, losses, match",
  [
    ([], [], "empty curve"),
    ([100, 200], [1.0], "mismatched lengths"),
    ([0, 100], [2.0, 1.0], "budgets must be positive"),
    ([-10, 100], [2.0, 1.0], "budgets must be positive"),
    ([100, 100, 200], [3.0, 2.0, 1.0], r"duplicate budgets: \[100.0\]"),
    ([100, 200], [2.0, float("nan")], "losses must be finite"),
    ([100, 200], [float("inf"), 1.0], "losses must be finite"),
    ([100, float("inf")], [2.0, 1.0], "budgets must be finite"),
    ([[100, 200]], [[2.0, 1.0]], "must be 1-D"),
  ],
)
def test_bad_curves_are_rejected_with_the_problem_named(budgets, losses, match):
  with pytest.raises(ValueError, match=match):
    protocol.monotone_envelope(budgets, losses)
  with pytest.raises(ValueError, match=match):
    protocol.steps_to_reach(budgets, losses, 1.5)
  with pytest.raises(ValueError, match=match):
    protocol.curve_loss_at(budgets, losses, 150)


# --- readings that cannot mislead -----------------------------------------------------------------


@SETTINGS
@given(st.one_of(curves(min_size=2, shuffle=False), close_curves()), st.data())
def test_an_arm_equal_to_the_anchor_reads_one_where_the_curve_drops_at_n(curve, data):
  """An arm whose loss is the anchor's N-step loss up to float rounding, on either side, reads 1.00x
  wherever the anchor's curve drops at every budget up to N (by more than float rounding), whatever
  comes after N (a drop of 2e-16 after N once read 2.00x)."""
  budgets, losses = curve
  k = data.draw(st.integers(0, len(budgets) - 1))
  # Monotone up to N: decreasing before it, beyond rounding; anything after it (above or below).
  head = sorted(losses[: k + 1], reverse=True)
  r = protocol.rounding
  assume(all(a - r(a) > b + r(b) for a, b in zip(head, head[1:])))  # drops, not float rounding
  losses = head + losses[k + 1 :]
  n, at_n = budgets[k], losses[k]
  hair = 0.2 * protocol.rounding(at_n)  # 2e-7 at a loss of 1: a float32 eval loss's last bits
  for eps in (-hair, 0.0, hair):
    r = protocol.ratio(protocol.steps_to_reach(budgets, losses, at_n + eps), n)
    assert not r["upper_bound"] and not r["lower_bound"]
    assert r["value"] == pytest.approx(1.0, rel=1e-12)


@SETTINGS
@given(st.one_of(curves(min_size=2), close_curves()), st.data())
def test_steps_to_reach_is_continuous_in_the_target(curve, data):
  """A hair either side of any loss on the curve, or of the edge of a knot's rounding band, reads about
  the same steps: no flat stretch and no rounding band makes a jump (a loss a hair below a flat stretch
  reads the stretch's first budget, not its far end). The reading's slope in log(steps) is bounded by
  the steepest stretch between two knots' bands."""
  budgets, losses = curve
  _, env = protocol.monotone_envelope(budgets, losses)
  kb, ke, _ = protocol.reading_knots(budgets, losses)
  band = np.asarray([protocol.rounding(x) for x in ke])
  edges = [*env.tolist(), *(ke - band).tolist(), *(ke + band).tolist()]
  target = data.draw(st.sampled_from(sorted(set(edges))))
  hair = 1e-12 * abs(target)
  lo, hi = (protocol.steps_to_reach(budgets, losses, target + d) for d in (-hair, hair))
  if lo.lower_bound or hi.upper_bound:  # past the curve's end or before its start
    return
  gaps = (ke[:-1] - band[:-1]) - (ke[1:] + band[1:])
  slope = max((np.log(kb[1:] / kb[:-1]) / gaps).tolist(), default=0.0)
  assert abs(np.log(lo.steps) - np.log(hi.steps)) <= 2 * hair * slope * (1 + 1e-6) + 1e-9


def test_a_control_equal_to_its_anchor_reads_one_not_the_far_end_of_a_flat_stretch():
  """The quick protocol's averaged anchor (seed 2): 40 steps reach 3.3732448, 50 steps do worse (a flat
  stretch of the envelope from 40 to 50), 80 steps better. A control 2e-7 below the anchor at N = 40 read
  1.25x (the stretch's far end, 50 steps, over 40); it reads 1.00x, as one 2e-7 above does."""
  budgets = [20, 40, 50, 80]
  anchor = [3.4029784202575684, 3.3732447624206543, 3.380293846130371, 3.3620588779449463]
  for eps in (-2e-7, 2e-7):
    reach = protocol.steps_to_reach(budgets, anchor, anchor[1] + eps)
    assert protocol.ratio(reach, 40)["value"] == pytest.approx(1.0, abs=1e-4)
  # A hair below the flat stretch: the stretch's first budget, interpolated towards the next drop.
  # (1e-5 is beyond float rounding: `protocol.rounding`; 1e-6 below reads 40, as 2e-7 does.)
  assert protocol.steps_to_reach(budgets, anchor, anchor[1] - 1e-6) == Reach(40.0, False)
  hair = protocol.steps_to_reach(budgets, anchor, anchor[1] - 1e-5)
  assert 40 < hair.steps < 40.1 and not hair.lower_bound


def test_a_loss_above_the_curves_start_is_an_upper_bound_not_not_reached():
  """The quick protocol's averaged anchor (seed 1) lies above its envelope at N (40 steps did worse than
  20): a control equal to it was 'not reached'; it reads an upper bound, the smallest budget over its
  cost, and the anchor's own N-step point is flagged as above its envelope."""
  budgets = [20, 40, 50, 80]
  anchor = [3.4012084007263184, 3.4475488662719727, 3.384679079055786, 3.303293228149414]
  reach = protocol.steps_to_reach(budgets, anchor, anchor[1] + 2e-7)
  assert reach == Reach(20.0, False, True)
  r = protocol.ratio(reach, 40)
  assert r["value"] == 0.5 and r["upper_bound"]
  s = protocol.summarize([r, protocol.ratio(Reach(42.0, False), 40)])
  assert s["n_upper_bound"] == 1 and s["n_null"] == 0 and s["mean"] == pytest.approx(0.775)
  own, curve = protocol.anchor_at_n(budgets, anchor, 40)
  assert own == anchor[1] and curve < anchor[0] < own  # N is no drop: the curve runs from 20 to 50


def test_the_verdict_reads_an_arm_as_the_anchor_reads_itself_at_n():
  """`cost_verdict`: an arm equal to the anchor (2e-7 apart, the same sign on both seeds) reads 'no
  difference' on a seed whose anchor lies above its envelope at N as on one whose does not; an arm below
  the curve at its cost pays, one above it does not."""
  budgets = [20, 40, 50, 80]
  curves = [
    (budgets, [3.4012084007263184, 3.4475488662719727, 3.384679079055786, 3.303293228149414]),  # above at N
    (budgets, [3.4029784202575684, 3.3732447624206543, 3.380293846130371, 3.3620588779449463]),  # a drop at N
  ]
  at_n = [c[1][1] for c in curves]
  equal = protocol.cost_verdict([x + 2e-7 for x in at_n], [40, 40], curves, 40, eval_se=0.04)
  assert equal["verdict"] == "no difference"
  assert equal["anchor_above_envelope_at_n"] == [True, False]
  chex.assert_trees_all_close(np.array(equal["differences_at_cost"]), np.full(2, 2e-7), atol=1e-12)
  assert equal["anchor_excess_at_n"][0] > 0 and equal["anchor_excess_at_n"][1] == 0
  # The same rounding without the eval set's error: two same-sign differences of 2e-7 are "higher" on
  # the seeds' spread alone (se 0 here): only the eval set's error makes them no difference.
  alone = protocol.cost_verdict([x + 2e-7 for x in at_n], [40, 40], curves, 40, eval_se=None)
  assert alone["paired"]["se_total"] == alone["paired"]["se"]
  # Below the curve at a cheaper cost: pays; above it: does not pay.
  assert protocol.cost_verdict([x - 0.05 for x in at_n], [38, 37], curves, 40, 0.01)["verdict"] == "pays"
  assert protocol.cost_verdict([x + 0.05 for x in at_n], [40, 41], curves, 40, 0.01)["verdict"] == "does not pay"
  # A cost outside the anchor's budgets, or one seed: not judged.
  assert protocol.cost_verdict(at_n, [10, 40], curves, 40, 0.01)["verdict"] == "not judged"
  assert protocol.cost_verdict(at_n[:1], [40], curves[:1], 40, 0.01)["verdict"] == "not judged"


def test_the_paired_per_batch_error_and_the_verdicts_it_judges():
  rng = np.random.default_rng(0)
  a = rng.normal(3.0, 0.3, size=48)  # the batches' own difficulty: one loss's sampling error ~0.3/sqrt(48)
  b = a + rng.normal(0.01, 0.002, size=48)  # a second run on the same batches
  se = protocol.paired_batch_se(a, b)
  assert se == pytest.approx(np.std(a - b, ddof=1) / math.sqrt(48))
  assert se < 0.01 * np.std(a, ddof=1) / math.sqrt(48) * 100 and se < 0.001  # the difficulty cancels
  assert protocol.paired_batch_se([3.2], [3.1]) is None  # one batch: cannot be estimated
  with pytest.raises(ValueError, match="mismatched lengths"):
    protocol.paired_batch_se([1.0, 2.0], [1.0])
  # The eval set's error enters whole: a shift of 0.002 on every seed is "higher" on the seeds alone,
  # "no difference" against an eval error of 0.002, "higher" again against 0.0005.
  x, y = [1.002, 2.0021, 3.0019], [1.0, 2.0, 3.0]
  assert protocol.paired_difference(x, y)["verdict"] == "higher"
  d = protocol.paired_difference(x, y, eval_se=0.002)
  assert d["verdict"] == "no difference" and d["eval_se"] == 0.002
  assert d["se_total"] == pytest.approx(math.hypot(d["se"], 0.002))
  assert protocol.paired_difference(x, y, eval_se=0.0005)["verdict"] == "higher"
  for bad in (-0.1, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="eval_se must be"):
      protocol.paired_difference(x, y, eval_se=bad)
