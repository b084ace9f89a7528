"""The diagnostic scripts: scripts/jump_persistence.py, scripts/drift_forecast.py and scripts/line_scan.py.

* jump_persistence: the drift, lag and gain arithmetic on hand examples; on a few steps of the
  `quick` benchmark config, that `raw+0r` continues the real run exactly (same batches, schedule
  and optimizer state) and that a move's loss is the loss of the moved params, rebuilt here.
* drift_forecast: on a few steps, each estimate scored (through the baseline loop's hook).
* line_scan: negative alphas and the averaged anchor's columns.
"""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np
import pytest
from conftest import load_script

from experiments import gpt2_small
from hybridjax import optim as optim_lib
from hybridjax.loop import train as train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


jp = load_script("jump_persistence")
line_scan = load_script("line_scan")


# --- arithmetic ---------------------------------------------------------------------------------


def test_ema_lag():
  assert jp.ema_lag(0.99) == pytest.approx(99.0)
  assert jp.ema_lag(0.998) == pytest.approx(499.0)
  assert jp.ema_lag(0.99, 1) == pytest.approx(0.0, abs=1e-9)  # one step: the average is the params
  assert jp.ema_lag(0.5, 2) == pytest.approx(1 / 3)  # weights 1 (age 0) and 1/2 (age 1): mean age 1/3
  assert jp.ema_lag(0.99, 100_000) == pytest.approx(99.0)


def test_ema_pair_drift_hand_example():
  fast = {"w": np.array([1.0, 2.0], np.float32), "b": np.array(3.0, np.float32)}
  slow = {"w": np.array([0.0, -1.0], np.float32), "b": np.array(0.0, np.float32)}
  r = jp.ema_pair_drift(fast, slow, jp.ema_lag(0.9), jp.ema_lag(0.99))  # lags 9 and 99: gap 90
  np.testing.assert_allclose(r["w"], [1 / 90, 3 / 90], rtol=1e-6)
  np.testing.assert_allclose(r["b"], 3 / 90, rtol=1e-6)
  with pytest.raises(ValueError, match="same lag"):
    jp.ema_pair_drift(fast, slow, 9.0, 9.0)


@pytest.mark.parametrize("n", [30, 1000])
def test_ema_pair_drift_recovers_a_constant_velocity(n):
  """Params moving at v, averaged as the train state averages them (`optim.update_average`): the
  drift with the exact lags is v at any count; with the long-run lags only once the bias
  correction has died out."""
  v = np.array([0.5, -2.0], np.float32)
  fast = optim_lib.Averaging(params=np.zeros(2, np.float32), beta=np.float32(0.9))
  slow = optim_lib.Averaging(params=np.zeros(2, np.float32), beta=np.float32(0.98))
  for i in range(1, n + 1):
    theta = i * v
    fast = optim_lib.update_average(fast, theta, i)
    slow = optim_lib.update_average(slow, theta, i)
  r = jp.ema_pair_drift(fast.params, slow.params, jp.ema_lag(0.9, n), jp.ema_lag(0.98, n))
  np.testing.assert_allclose(r, v, rtol=2e-3)
  r_long = jp.ema_pair_drift(fast.params, slow.params, jp.ema_lag(0.9), jp.ema_lag(0.98))
  assert np.allclose(r_long, v, rtol=2e-3) == (n == 1000)


def test_snapshot_drift_and_move():
  r = jp.snapshot_drift({"a": np.array([4.0])}, {"a": np.array([2.0])}, 4)
  np.testing.assert_allclose(r["a"], [0.5])
  base = {"a": np.array([1.0], np.float32)}
  np.testing.assert_allclose(jp.move(base, r, -2)["a"], [0.0])
  assert jp.move(base, r, 0) is base


def test_parse_candidates():
  got = jp.parse_candidates("avg,raw,raw+100r,raw-100r,avg+2.5r,raw+0r")
  assert [(c.base, c.k) for c in got] == [
    ("avg", 0.0),
    ("raw", 0.0),
    ("raw", 100.0),
    ("raw", -100.0),
    ("avg", 2.5),
    ("raw", 0.0),
  ]
  for bad in ("raw+100", "ema+1r", "raw*2r", ""):
    with pytest.raises(ValueError, match="--candidates"):
      jp.parse_candidates(bad)
  assert jp.parse_ints("200,25,50", "--after") == [25, 50, 200]
  with pytest.raises(ValueError, match="--after"):
    jp.parse_ints("0,25", "--after")


def test_negative_alphas_parse():
  assert line_scan.parse_alphas("-8,-4,-2,-1,0,1,2,4,8,16") == [-8, -4, -2, -1, 0, 1, 2, 4, 8, 16]
  assert line_scan.parse_alphas("1,-0.5,1") == [-0.5, 1.0]
  with pytest.raises(ValueError, match="--alphas"):
    line_scan.parse_alphas("a,b")


def test_gain_on_the_running_min_curve():
  steps, losses = [0, 10, 20, 30], [3.0, 2.0, 2.5, 1.0]  # running min 3, 2, 2, 1
  assert jp.step_reaching(steps, losses, 2.5) == pytest.approx(5.0)  # interpolated from 3 at 0 to 2 at 10
  assert jp.step_reaching(steps, losses, 2.0) == pytest.approx(10.0)
  assert jp.step_reaching(steps, losses, 1.5) == pytest.approx(25.0)  # the plateau 20..30 then 1
  assert jp.step_reaching(steps, losses, 4.0) == 0.0
  assert jp.step_reaching(steps, losses, 0.9) is None
  assert jp.gain(steps, losses, 1.5, 20) == pytest.approx(5.0)  # ahead of step 20 by 5 steps
  assert jp.gain(steps, losses, 2.5, 20) == pytest.approx(-15.0)  # the real run was there at step 5
  assert jp.gain(steps, losses, 0.5, 20) is None  # beyond the curve's end
  assert jp.gain(steps, losses, float("nan"), 20) is None


# --- the scripts, end to end on a few steps -----------------------------------------------------

_T, _AFTER, _K = 8, (3, 6), 4.0
_JP_ARGS = [
  "--config=quick",
  "--steps=16",
  f"--at={_T}",
  f"--after={','.join(map(str, _AFTER))}",
  "--every=4",
  "--slow_beta=0.95",
  f"--candidates=raw+0r,avg+{_K:g}r",
]


# The diagnostic's whole run (its own programs to compile, 6-8 s): the slow set, which CI runs; its pieces
# are the tests above.
@pytest.mark.slow
def test_jump_persistence_end_to_end(tmp_path, capsys):
  out = tmp_path / "jump.json"
  result = jp.main([*_JP_ARGS, f"--out={out}"])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  assert result["seed"] == 1001 and result["steps"] == 16 and result["drift"]["kind"] == "ema_pair"
  (info,) = result["jumps"]
  assert info["step"] == _T
  same, moved = info["candidates"]
  assert [p["after"] for p in same["points"]] == [0, *_AFTER]

  # raw+0r continues the real run exactly: the same batches, schedule and optimizer state.
  for p in same["points"]:
    assert p["raw"] == p["real_raw"] and p["avg"] == p["real_avg"], p
    assert p["gain_raw"] == p["real_gain_raw"] and p["gain_avg"] == p["real_gain_avg"], p
    assert p["real_gain_raw"] <= 0 and p["real_gain_avg"] <= 0
  curve = {c["step"]: c for c in result["curve"]}
  assert set(curve) >= {0, 4, 8, 11, 12, 14, 16}  # every 4 steps, the jump and its continuation steps
  assert curve[_T + _AFTER[-1]]["raw"] == same["points"][-1]["raw"]
  assert moved["points"][0]["raw"] != same["points"][0]["raw"]  # the move did move

  # The loss right after the move is that of the moved params, rebuilt here from scratch.
  c = jp.build_config("quick", 1001, None, 16)
  task = gpt2_small.build_task(c)
  tx = optim_lib.make_optimizer(c.optim)
  schedule = optim_lib.make_schedule(c.optim, 16)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(1001))
  state = optim_lib.init_train_state(task.init_params(params_rng), tx, c.trainer.averaging_beta)
  slow = optim_lib.Averaging(params=state.params, beta=np.float32(0.95))
  step = jax.jit(lambda s, b: optim_lib.train_step(s, b, schedule, loss_fn=task.loss_fn, tx=tx))
  for i in range(_T):
    state, _ = step(state, task.train_batch(i))
    slow = optim_lib.update_average(slow, state.params, i + 1)
  avg = jax.device_get(state.averaging.params)
  r = jp.ema_pair_drift(avg, jax.device_get(slow.params), jp.ema_lag(0.99, _T), jp.ema_lag(0.95, _T))
  assert info["lag_fast"] == pytest.approx(jp.ema_lag(0.99, _T))
  eval_fn = train_lib.make_eval_fn(task.loss_fn)
  want = train_lib.evaluate(eval_fn, jp.move(avg, r, _K), task.eval_batches)
  assert moved["points"][0]["raw"] == pytest.approx(want, rel=1e-5)
  assert moved["points"][0]["avg"] == moved["points"][0]["raw"]  # avg + K r: the average moves with it

  printed = capsys.readouterr().out
  assert f"jump at step {_T}" in printed and f"avg+{_K:g}r" in printed


def test_jump_persistence_rejects_bad_settings():
  with pytest.raises(ValueError, match="--at"):
    jp.main(["--config=quick", "--steps=16", "--at=16"])
  with pytest.raises(ValueError, match="--span"):
    jp.main(["--config=quick", "--steps=16", "--at=4", "--drift=snapshot", "--span=5"])


def test_drift_forecast_scores_each_estimate():
  df = load_script("drift_forecast")
  args = ["--config=quick", "--steps=15", "--every=10", "--horizons=5", "--spans=5", "--slow_betas=0.995"]
  result = df.main(args)
  assert result["points"] == [10]
  assert set(result["summary"]) == {"ema_pair(slow 0.995)", "snapshot(span 5)"}
  for scores in result["summary"].values():
    assert -1 <= scores["5"]["cos"] <= 1 and scores["5"]["rel_error"] >= 0


@pytest.mark.slow  # an end-to-end run; CI runs it (`-m ""`)
def test_line_scan_reports_the_averaged_anchor(capsys):
  result = line_scan.main(["--preset=tiny,micro", "--at=3", "--alphas=-1,0,1"])
  assert result["alphas"] == [-1.0, 0.0, 1.0] and result["averaging_beta"] == 0.99
  (p,) = result["points"]
  assert p["step"] == 3
  for key in ("along_v", "real_steps", "averaged_along_v", "averaged_real_steps"):
    assert len(p[key]) == 3, key
  assert p["along_v"][1] == p["real_steps"][1] == p["raw"]  # a = 0 is the raw params
  assert p["averaged_along_v"][1] == p["averaged_real_steps"][1] == p["averaged"]  # ... the averaged ones
  assert p["real_steps"][0] is None and p["averaged_real_steps"][0] is None  # no real steps backwards
  assert p["averaged"] != p["raw"]
  printed = capsys.readouterr().out
  assert "avg + a*v" in printed and "avg, real steps" in printed


def test_tune_method_refuses_a_variant_whose_runs_are_not_valid_before_reading_anything(tmp_path):
  """A variant is checked as the benchmark checks its arms, before the family's record is read: the
  benchmark presets' slow EMA follows `slow_lag_ratio`, so a `slow_beta` would train nothing. The
  variants docs/usage.md prints pass the same check (then stop at the missing family record)."""
  tune = load_script("tune_method")
  missing = ["--workdir", str(tmp_path / "no-family")]
  with pytest.raises(ValueError, match=r"--variant 'beta'.*hybrid\.jump\.slow_beta \(0\.995\) is set but unused"):
    tune.main(["--config=long", "--method=jump", "--variant=beta:hybrid.jump.slow_beta=0.995", *missing])
  with pytest.raises(ValueError, match=r"--variant 'typo'.*hybrid\.jump\.horizon"):
    tune.main(["--config=long", "--method=jump", "--variant=typo:hybrid.jump.horizon=(5,)", *missing])
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "usage.md"), encoding="utf-8") as f:
    printed = re.findall(r'--method=(\w+) \\\n\s+--variant="([^"]+)"', f.read())
  assert printed
  for method, variant in printed:
    with pytest.raises(FileNotFoundError, match="benchmark.json"):
      tune.main(["--config=long", f"--method={method}", f"--variant={variant}", *missing])


def test_plugin_overhead_takes_a_preset_and_refuses_another():
  """scripts/plugin_overhead.py times a benchmark preset's runs (`--preset`, quick or long); any other
  preset, or too few rounds for an IQR, is refused before anything is built."""
  script = load_script("plugin_overhead")
  assert script.PRESETS == ("quick", "long")
  with pytest.raises(SystemExit):
    script.main(["--preset=tiny"])
  with pytest.raises(SystemExit):
    script.main(["--rounds=1"])


def test_plugin_overhead_reads_its_interval_from_the_rounds_paired_ratios():
  """The overhead's 95% interval is a t interval of the rounds' mean log ratio (method over baseline, each
  round's medians): rounds whose ratios agree give a narrow interval around their ratio, rounds that
  scatter as much as the difference give one that includes no overhead."""
  import math

  from scipy import stats

  interval = load_script("plugin_overhead").overhead_interval
  lo, hi = interval([10.0, 10.0, 10.0], [11.0, 11.0, 11.0 + 1e-9])
  assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
  base, method = [10.0, 12.0, 9.0, 11.0], [10.5, 11.0, 10.0, 11.5]
  logs = [math.log(m / b) for b, m in zip(base, method)]
  mean, se = sum(logs) / 4, stats.sem(logs)
  half = stats.t.ppf(0.975, 3) * se
  assert interval(base, method) == pytest.approx((math.expm1(mean - half), math.expm1(mean + half)))
  assert interval(base, method)[0] < 0 < interval(base, method)[1]


@pytest.mark.slow  # compiles both sides of the quick preset
def test_plugin_overhead_reports_both_sides_median_and_iqr_at_quick(capsys):
  """A smoke run at `quick` (2 rounds of 2 steps: what it prints, not what it measures): each side's
  median ms per step and its IQR over the rounds, and the idle method's overhead."""
  out = load_script("plugin_overhead").main(["--preset=quick", "--rounds=2", "--steps=2"])
  assert (out["preset"], out["rounds"], out["steps"]) == ("quick", 2, 2)
  for side in ("baseline", "idle method"):
    assert out[side]["median_ms"] > 0 and out[side]["iqr_ms"] >= 0, side
  assert out["overhead"] == pytest.approx(out["idle method"]["median_ms"] / out["baseline"]["median_ms"] - 1)
  lo, hi = out["overhead_ci95"]
  assert lo <= hi
  printed = capsys.readouterr().out
  assert "95% interval over the rounds' paired ratios [" in printed
  assert "preset quick: 2 interleaved rounds of 2 steps per side" in printed
  assert "baseline" in printed and "IQR over the rounds" in printed and "overhead of the idle method" in printed
