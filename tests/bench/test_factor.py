"""hybridjax.bench.factor: the fitted curves, both readings of a factor inside the budgets run (bounds
outside), their two 95% intervals, and a cell's verdict against the field; on synthetic curves whose factor
is known, with noise of the measured sizes."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import scipy.stats
from conftest import ROOT

from hybridjax.bench import factor, protocol

N = 3000
ADAMW_T = (0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)  # the study's AdamW curve with both extensions, over N
MUON_T = (0.2, 0.25, 0.33, 0.5, 0.75, 1.0)  # Muon's, extended down
# Noise of the measured sizes, at `long` (docs/results/recipe/recipe-long.json): the R4 anchor's curves fit
# L = a_s + 0.21 (T/N)^-0.69 with a spread of 0.008 in the seeds' levels and a residual of 0.006 per run; a
# run's loss on one of 48 eval windows spreads by 0.08 with the window (common to every run) and by 0.013
# with the run (a paired per-window standard error of 0.0027 for a difference of two runs).
CURVE = {"a": 1.56, "b": 0.21, "c": 0.69}
NOISE = {"seed_sd": 0.008, "run_sd": 0.005, "window_sd": 0.08, "window_noise": 0.013}


def synthetic(
  k: float,
  rng: np.random.Generator,
  seeds: int = 5,
  windows: int = 48,
  adamw_t: tuple[float, ...] = ADAMW_T,
  muon_t: tuple[float, ...] = MUON_T,
  noise: dict[str, float] = NOISE,
) -> dict[str, dict[str, dict[str, list]]]:
  """Both sides' curves with a known factor `k`: Muon's curve is AdamW's run k times as many steps
  (L_muon(T) = L_adamw(k T)), so both readings are k on every seed; the seed's level is common to the
  two sides (its data order), each run adds its own noise, each window its difficulty (common to every run)
  and the run's noise on it. A run's loss is the mean over its windows."""
  common = rng.normal(0, noise["window_sd"], windows)
  offsets = rng.normal(0, noise["seed_sd"], seeds)
  out: dict[str, dict[str, dict[str, list]]] = {}
  for side, ts, stretch in (("adamw", adamw_t, 1.0), ("muon", muon_t, k)):
    out[side] = {}
    for s in range(seeds):
      steps, loss, per = [], [], []
      for t in ts:
        mean = CURVE["a"] + offsets[s] + CURVE["b"] * (stretch * t) ** -CURVE["c"]
        w = mean + rng.normal(0, noise["run_sd"]) + common + rng.normal(0, noise["window_noise"], windows)
        steps.append(round(t * N))
        loss.append(float(w.mean()))
        per.append(w.tolist())
      out[side][str(21 + s)] = {"steps": steps, "loss": loss, "per_window": per}
  return out


QUIET = {"seed_sd": 0.008, "run_sd": 0.0, "window_sd": 0.0, "window_noise": 0.0}


def test_curves_that_do_not_fall_with_the_budget_are_refused_naming_the_next_step():
  """A side whose losses do not fall with the budget (the runs too short for a budget to matter) gives no
  factor: the error names the side, N and what to change (longer runs, a larger preset)."""
  curves = synthetic(1.5, np.random.default_rng(0))
  for run in curves["muon"].values():
    run["loss"] = sorted(run["loss"])  # rising with the budget
    run["per_window"] = None
  for run in curves["adamw"].values():
    run["per_window"] = None
  with pytest.raises(ValueError, match=r"^muon: its curves do not fall with the budget .* at N = 3000: .*larger "
                     r"--config\.trainer\.steps, or a larger preset such as long"):  # fmt: skip
    factor.factor(curves["adamw"], curves["muon"], N, draws=10)


def test_the_fit_recovers_a_noiseless_curve_and_each_seeds_level():
  t = np.array(ADAMW_T)
  levels = np.array([1.50, 1.52, 1.49])
  y = levels[:, None] + 0.3 * t**-0.55
  fit = factor.fit_curves(t, y)
  np.testing.assert_allclose(fit["levels"], levels, atol=2e-4)
  assert fit["b"] == pytest.approx(0.3, rel=2e-3) and fit["c"] == pytest.approx(0.55, rel=2e-3)


def test_a_curve_that_rises_with_its_budget_is_refused_naming_its_side():
  data = synthetic(2.0, np.random.default_rng(0), noise=QUIET)
  for s in data["adamw"].values():
    s["loss"] = s["loss"][::-1]
  del_windows(data)
  with pytest.raises(ValueError, match="adamw: its curves do not fall"):
    factor.factor(data["adamw"], data["muon"], N, draws=100)


def del_windows(data: dict) -> None:
  for side in data.values():
    for run in side.values():
      run.pop("per_window", None)


@pytest.mark.parametrize("k", [1.3, 2.0, 3.0])
def test_both_readings_of_a_noiseless_stretch_are_its_factor(k):
  out = factor.factor(*_sides(synthetic(k, np.random.default_rng(1), noise=QUIET)), N, draws=100)
  for reading in ("a", "b"):
    assert out[reading]["mean"] == pytest.approx(k, rel=2e-3)
    assert out[reading]["bound"] is None and out[reading]["per_seed_bound"] == [0] * 5
    lo, hi = out[reading]["ci95"]
    assert lo <= out[reading]["mean"] <= hi and hi / lo < 1.01
  assert out["fits"]["adamw"]["c"] == pytest.approx(CURVE["c"], rel=2e-3)


def _sides(data: dict) -> tuple[dict, dict]:
  return data["adamw"], data["muon"]


def test_a_factor_beyond_the_budgets_run_is_a_bound_at_the_last_budget_never_an_extrapolation():
  # Muon's loss at N needs 8 N of AdamW, which ran to 3 N: reading (a) is "at least 3"; Muon ran down to
  # N/3, and AdamW's loss at N needs N/8 of Muon: reading (b) is "at least 3" too.
  data = synthetic(8.0, np.random.default_rng(2), adamw_t=ADAMW_T[:6], muon_t=MUON_T[2:], noise=QUIET)
  out = factor.factor(*_sides(data), N, draws=100)
  assert out["a"]["bound"] == "lower" and out["a"]["per_seed_bound"] == [1] * 5
  assert out["a"]["mean"] == pytest.approx(3.0)
  assert out["b"]["bound"] == "lower" and out["b"]["mean"] == pytest.approx(N / round(0.33 * N))
  assert out["a"]["bounded_draws"] == 1.0
  assert factor.cell_verdict(out["a"]) == "above the field"


def test_a_factor_below_the_smallest_budget_is_an_upper_bound():
  # Muon slower than AdamW (k = 0.5): AdamW reaches Muon's loss at N in N/2, below its 0.75 N.
  out = factor.factor(*_sides(synthetic(0.5, np.random.default_rng(3), noise=QUIET)), N, draws=100)
  assert out["a"]["bound"] == "upper" and out["a"]["mean"] == pytest.approx(0.75)
  assert factor.cell_verdict(out["a"]) == "within the field"


def test_a_noisy_factor_of_the_measured_sizes_reads_inside_its_interval():
  for k, seed in ((1.4, 4), (2.0, 5)):
    out = factor.factor(*_sides(synthetic(k, np.random.default_rng(seed))), N, draws=400, seed=seed)
    assert out["windows_resampled"] and out["draws"] == 400
    for reading in ("a", "b"):
      r = out[reading]
      lo, hi = r["ci95"]
      assert lo < k < hi, (k, reading, r)
      assert r["interval"] in ("t", "bootstrap")
      assert r["ci95"] == (r["ci95_t"] if r["interval"] == "t" else r["ci95_bootstrap"])
      widths = [math.log(x[1] / x[0]) for x in (r["ci95_t"], r["ci95_bootstrap"])]
      assert math.log(hi / lo) == pytest.approx(max(widths))
      assert r["mean"] == pytest.approx(math.exp(np.mean(np.log(r["per_seed"]))))  # geometric, not arithmetic


def test_the_bootstrap_is_reproducible_from_its_seed_and_reads_windows_only_where_every_run_kept_them():
  data = synthetic(2.0, np.random.default_rng(6))
  one = factor.factor(*_sides(data), N, draws=200, seed=3)
  assert one == factor.factor(*_sides(data), N, draws=200, seed=3)
  assert one["a"]["ci95_bootstrap"] != factor.factor(*_sides(data), N, draws=200, seed=4)["a"]["ci95_bootstrap"]
  del data["muon"]["21"]["per_window"]
  assert not factor.factor(*_sides(data), N, draws=200)["windows_resampled"]


def test_unpaired_seeds_too_few_seeds_or_budgets_are_refused():
  data = synthetic(2.0, np.random.default_rng(7), noise=QUIET)
  adamw, muon = _sides(data)
  with pytest.raises(ValueError, match="same headline seeds"):
    factor.factor(adamw, {s: muon[s] for s in list(muon)[:4]}, N, draws=100)
  with pytest.raises(ValueError, match="at least 2 headline seeds"):
    factor.factor({"21": adamw["21"]}, {"21": muon["21"]}, N, draws=100)
  one_budget = {s: {"steps": r["steps"][:1], "loss": r["loss"][:1]} for s, r in adamw.items()}
  with pytest.raises(ValueError, match="adamw seed 21: a curve needs at least 2 budgets"):
    factor.factor(one_budget, muon, N, draws=100)
  with pytest.raises(ValueError, match="at least 100 draws"):
    factor.factor(adamw, muon, N, draws=10)


def test_the_t_interval_is_the_geometric_mean_times_t_quantile_standard_errors():
  logs = np.log([1.8, 2.0, 2.2, 1.9])
  lo, hi = factor.t_interval(logs)
  half = 3.182446305284263 * np.std(logs, ddof=1) / 2  # t(0.975, 3)
  assert math.log(lo) == pytest.approx(np.mean(logs) - half) and math.log(hi) == pytest.approx(np.mean(logs) + half)


@pytest.mark.parametrize(
  "ci, bound, verdict",
  [
    ([1.6, 2.4], None, "above the field"),
    ([1.1, 1.45], None, "within the field"),
    ([1.3, 1.9], None, "undetermined"),
    ([1.2, 1.4], "lower", "undetermined"),  # at least 1.2-1.4: the top is open
    ([1.6, 1.8], "upper", "undetermined"),  # at most: the bottom is open
    ([1.6, 1.8], "lower", "above the field"),
    ([1.1, 1.4], "upper", "within the field"),
  ],
)
def test_a_cells_verdict_reads_reading_a_s_interval_against_one_and_a_half(ci, bound, verdict):
  assert factor.cell_verdict({"ci95": ci, "bound": bound}) == verdict


@pytest.mark.slow
def test_the_interval_covers_a_known_factor_90_to_99_percent_of_the_time():
  """Over 200 synthetic draws of the measured noise sizes (5 headline seeds, 48 eval windows), the
  printed (wider) 95% interval of each reading covers the true factor 90-99% of the time."""
  rng = np.random.default_rng(2026)
  covered = {"a": 0, "b": 0}
  draws = 200
  for i in range(draws):
    k = float(np.exp(rng.uniform(math.log(1.2), math.log(2.5))))
    out = factor.factor(*_sides(synthetic(k, rng)), N, draws=300, seed=i)
    for reading in covered:
      lo, hi = out[reading]["ci95"]
      covered[reading] += lo <= k <= hi
  for reading, hits in covered.items():
    assert 0.90 * draws <= hits <= 0.99 * draws, (reading, hits)


def test_the_change_between_two_cells_reads_their_ratio_with_an_interval_around_it():
  rng = np.random.default_rng(8)
  before = factor.factor(*_sides(synthetic(2.0, rng)), N, draws=300)["a"]
  after = factor.factor(*_sides(synthetic(1.4, rng)), N, draws=300)["a"]
  change = factor.cell_change(before, after)
  assert change["ratio"] == pytest.approx(after["mean"] / before["mean"])
  lo, hi = change["ci95"]
  assert lo < 0.7 < hi and hi < 1.0  # 1.4 / 2: the shrink is read, and beyond the noise
  assert change["ci95_t"] is not None and change["bound"] is None
  assert math.log(hi / lo) == pytest.approx(
    max(math.log(x[1] / x[0]) for x in (change["ci95_t"], change["ci95_bootstrap"]))
  )
  same = factor.cell_change(before, before)
  assert same["ratio"] == 1.0 and same["ci95"][0] < 1.0 < same["ci95"][1]
  bounded = factor.cell_change(before, after | {"bound": "lower"})
  assert bounded["bound"] == "lower"
  assert factor.cell_change(before | {"bound": "lower"}, after)["bound"] == "upper"


def test_on_the_published_families_the_fitted_readings_agree_with_the_curves_own_points():
  """Muon's family against AdamW's at `long` (each tuned on its LR and averaging beta, each on its own
  averaged budget curve, 0.5-2 N, docs/results/long-{adamw,muon}-cosine): per seed, the fitted readings lie
  within 5% of the readings interpolated between the curves' own points (`protocol.steps_to_reach`), and a
  reading beyond AdamW's last budget is a bound on both."""
  sides = {}
  for name in ("adamw", "muon"):
    with open(os.path.join(ROOT, "docs", "results", f"long-{name}-cosine", "benchmark.json")) as f:
      r = json.load(f)
    sides[name] = {s: {"steps": r["budgets"], "loss": x} for s, x in r["curves"]["averaged_baseline"].items()}
  n = r["steps"]
  out = factor.factor(sides["adamw"], sides["muon"], n, draws=100)
  for k, s in enumerate(out["seeds"]):
    a, m = sides["adamw"][s], sides["muon"][s]
    at_n = {name: c["loss"][c["steps"].index(n)] for name, c in (("adamw", a), ("muon", m))}
    reach_a = protocol.steps_to_reach(a["steps"], a["loss"], at_n["muon"])
    assert (out["a"]["per_seed_bound"][k] == 1) == reach_a.lower_bound
    assert out["a"]["per_seed"][k] == pytest.approx(reach_a.steps / n, rel=0.05)
    reach_b = protocol.steps_to_reach(m["steps"], m["loss"], at_n["adamw"])
    assert out["b"]["per_seed"][k] == pytest.approx(n / reach_b.steps, rel=0.05)


@pytest.mark.parametrize("k", [1.3, 2.0])
def test_the_interpolated_reading_reads_a_stretch_without_the_fit(k):
  """On curves of the fitted form, the model-free reading (linear in log budget between the budgets run)
  is near the fitted one; a reading past the budgets run is a bound, as the fitted one is."""
  data = synthetic(k, np.random.default_rng(1), noise=QUIET)
  inter = factor.interpolated(*_sides(data), N)
  for reading in ("a", "b"):
    r = inter[reading]
    assert r["mean"] == pytest.approx(k, rel=0.03) and r["bound"] is None
    assert r["ci95_t"][0] <= r["mean"] <= r["ci95_t"][1] and len(r["per_seed"]) == 5
  short = {s: {"steps": c["steps"][:2], "loss": c["loss"][:2]} for s, c in data["adamw"].items()}  # to 1 N
  assert factor.interpolated(short, data["muon"], N)["a"]["bound"] == "lower"


def test_the_smallest_factor_five_seeds_tell_from_one_at_80_percent_power():
  """Five seeds of per-seed sd 0.085 in log (the measured noise) tell about 1.15x from 1.0x at 80% power;
  twenty tell less; the verdict against 1.0x names it, and places the interval against the field's range."""
  sd, n = 0.085, 5
  half = float(scipy.stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
  five = factor.detectable([math.exp(-half), math.exp(half)], n)
  assert 1.13 < five < 1.17
  half20 = float(scipy.stats.t.ppf(0.975, 19)) * sd / math.sqrt(20)
  assert 1.0 < factor.detectable([math.exp(-half20), math.exp(half20)], 20) < five
  one = {"ci95": [0.95, 1.15], "bound": None, "per_seed": [1.0] * 5}
  out = factor.verdict_against_one(one, (1.1, 1.52))
  assert out["verdict"] == "undetermined" and out["against_field"] == "overlapping" and out["detectable"] > 1
  assert factor.verdict_against_one(one | {"ci95": [1.2, 1.4]}, (1.1, 1.52))["against_field"] == "inside"
  assert factor.verdict_against_one(one | {"ci95": [1.6, 2.0]}, (1.1, 1.52))["verdict"] == "above 1.0×"
  assert factor.verdict_against_one(one | {"ci95": [0.7, 0.9]}, (1.1, 1.52))["against_field"] == "below"
  assert factor.verdict_against_one(one | {"ci95": [0.7, 0.9], "bound": "lower"})["verdict"] == "undetermined"


def _stretched(k: float, sd: float, rng: np.random.Generator, seeds: int = 5) -> tuple[dict, dict]:
  """Per-seed curves of the fitted form, Muon's seed s AdamW's run k exp(e_s) times as many steps, e_s of sd
  `sd` in log: each seed's reading is k exp(e_s)."""
  adamw, muon = {}, {}
  for s in range(seeds):
    stretch = k * math.exp(rng.normal(0, sd))
    level = CURVE["a"] + rng.normal(0, NOISE["seed_sd"])
    for side, ts, x in ((adamw, ADAMW_T, 1.0), (muon, MUON_T, stretch)):
      side[str(21 + s)] = {
        "steps": [round(t * N) for t in ts],
        "loss": [level + CURVE["b"] * (x * t) ** -CURVE["c"] for t in ts],
      }
  return adamw, muon


@pytest.mark.slow  # 200 factors with their bootstraps (seconds)
def test_the_interval_covers_a_known_factor_at_the_measured_per_seed_noise():
  """Per-seed curves with a known factor and the measured per-seed noise (sd 0.085 in log, 5 seeds): reading
  (a)'s printed 95% interval covers the factor 92-99% of the time, and at 1.0x the verdict against 1.0x is
  "undetermined" as often."""
  rng = np.random.default_rng(58)
  draws, covered, undetermined = 200, 0, 0
  for i in range(draws):
    k = 1.0 if i % 2 else float(np.exp(rng.uniform(math.log(1.1), math.log(2.0))))
    a = factor.factor(*_stretched(k, 0.085, rng), N, draws=200, seed=i)["a"]
    covered += a["ci95"][0] <= k <= a["ci95"][1]
    undetermined += k == 1.0 and factor.verdict_against_one(a)["verdict"] == "undetermined"
  assert 0.92 * draws <= covered <= 0.99 * draws, covered
  assert 0.92 * draws / 2 <= undetermined, undetermined
