"""The benchmark's outputs are well-formed and self-consistent. No test here asserts a speedup."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import benchmark
from experiments.configs import benchmark as benchmark_cfg


def _curve(losses, step_every=10, backward=None, seconds=None):
  return [
    {
      "step": step_every * (i + 1),
      "eval_loss": loss,
      "backward_passes": (backward or [step_every * (i + 1) for i in range(len(losses))])[i],
      "train_s": (seconds or [0.1 * (i + 1) for i in range(len(losses))])[i],
    }
    for i, loss in enumerate(losses)
  ]


def _run(losses, backward=None, seconds=None, predict=0, phase_ms=None):
  run = {
    "final_eval_loss": losses[-1],
    "curve": _curve(losses, backward=backward, seconds=seconds),
    "memory_growth_bytes": [0],
    "memory_source": "jax.live_arrays",
    "ms_per_step": 10.0,
    "backward_passes": (backward or [10 * len(losses)])[-1],
  }
  if phase_ms is not None:
    run.update(
      phase_steps={"WARMUP": 5, "FULL": 5, "PREDICT": predict, "CORRECT": 10},
      phase_ms_per_step=phase_ms,
      dynamics_ms=1.0,
    )
  return run


def test_figures_ratio_and_not_reached():
  base = _run([3.0, 2.5, 2.0, 1.9])
  fast = _run(
    [2.9, 1.85, 1.8, 1.7],
    backward=[5, 10, 15, 20],
    seconds=[0.05, 0.1, 0.15, 0.2],
    predict=20,
    phase_ms={"FULL": 10.0, "PREDICT": 2.0},
  )
  slow = _run([3.0, 2.6, 2.2, 2.0], predict=0, phase_ms={"FULL": 10.0})
  fig = benchmark.compute_figures({"baseline": base, "hybrid": fast, "constant_alpha": slow})
  assert fig["target_eval_loss"]["value"] == 1.9
  h = fig["hybrid"]
  # The baseline reaches 1.9 at its 4th eval (40 backward passes, 0.4 s); hybrid at its 2nd.
  assert h["backward_ratio"]["value"] == pytest.approx(40 / 10)
  assert h["wallclock_ratio"]["value"] == pytest.approx(0.4 / 0.1)
  assert h["final_loss_gap"]["value"] == pytest.approx((1.7 - 1.9) / 1.9)
  assert h["step_cost"]["value"] == {"FULL": 1.0, "PREDICT": 0.2}
  assert h["dynamics_share"]["value"] == pytest.approx(0.1)
  c = fig["constant_alpha"]
  assert c["backward_ratio"]["value"] == benchmark.NOT_REACHED
  assert c["wallclock_ratio"]["best_eval_loss"] == 2.0
  assert c["final_loss_gap"]["value"] > 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.5, 5.0), min_size=1, max_size=12), st.lists(st.floats(0.5, 5.0), min_size=1, max_size=12))
def test_ratio_is_defined_exactly_when_the_target_is_reached(base_losses, run_losses):
  n = len(run_losses)
  fig = benchmark.compute_figures(
    {
      "baseline": _run(base_losses),
      "hybrid": _run(run_losses, backward=[3 * (i + 1) for i in range(n)], phase_ms={"FULL": 5.0}),
    }
  )
  target = base_losses[-1]
  ratio = fig["hybrid"]["backward_ratio"]
  if min(run_losses) <= target:
    first = next(i for i, x in enumerate(run_losses) if x <= target)
    base_first = next(i for i, x in enumerate(base_losses) if x <= target)
    assert ratio["value"] == pytest.approx(10 * (base_first + 1) / (3 * (first + 1)))
  else:
    assert ratio["value"] == benchmark.NOT_REACHED


def test_bad_runs_setting_is_refused():
  c = benchmark_cfg.get_config("quick")
  c.benchmark.runs = "hybrid,turbo"
  with pytest.raises(ValueError, match="benchmark.runs"):
    benchmark.parse_runs(c)
  with pytest.raises(ValueError, match="unknown benchmark preset"):
    benchmark_cfg.get_config("huge")


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("bench") / "quick")
  config = benchmark_cfg.get_config("quick")
  config.trainer.compile_cache = False  # the test measures nothing; keep user caches untouched
  return workdir, benchmark.run_benchmark(config, workdir)


@pytest.mark.slow  # three training runs of the quick preset: about 1.5 minutes on 2 cores
def test_quick_benchmark_json_is_self_consistent(quick_result):
  workdir, result = quick_result
  with open(os.path.join(workdir, "benchmark.json")) as f:
    stored = json.load(f)
  # The figures recompute from the raw records the file holds.
  assert benchmark.compute_figures(stored["runs"]) == {
    k: v for k, v in stored["figures"].items() if k != "switch_overhead"
  }
  base = stored["runs"]["baseline"]
  assert base["backward_passes"] == stored["config"]["trainer"]["steps"]
  for name in ("hybrid", "constant_alpha"):
    run, fig = stored["runs"][name], stored["figures"][name]
    steps = sum(run["phase_steps"].values())
    assert steps == stored["config"]["trainer"]["steps"]
    assert run["backward_passes"] == steps - run["phase_steps"]["PREDICT"]
    assert fig["predict_fraction"]["value"] == run["phase_steps"]["PREDICT"] / steps
    gap = fig["final_loss_gap"]
    assert gap["value"] == pytest.approx((run["final_eval_loss"] - base["final_eval_loss"]) / base["final_eval_loss"])
    for key, num, den in (
      ("backward_ratio", "baseline_backward_passes", "run_backward_passes"),
      ("wallclock_ratio", "baseline_train_s", "run_train_s"),
    ):
      r = fig[key]
      if r["value"] == benchmark.NOT_REACHED:
        assert min(p["eval_loss"] for p in run["curve"]) > base["final_eval_loss"]
      else:
        assert r["value"] == pytest.approx(r[num] / r[den])
    assert all(math.isfinite(v) and v > 0 for v in fig["step_cost"]["value"].values())
    # Every run saw the same held-out batches at the same steps.
    assert [p["step"] for p in run["curve"]] == [p["step"] for p in base["curve"]]
  assert set(stored["figures"]["memory_growth"]["value"]) == {"baseline", "hybrid", "constant_alpha"}
  for name in ("results.md", "eval_vs_time.png", "eval_vs_backward.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0, name
  with open(os.path.join(workdir, "results.md")) as f:
    table = f.read()
  assert "backward_ratio" in table and "final eval loss" in table


@pytest.mark.parametrize("leftover", ["benchmark.json", "hybrid"])
def test_benchmark_refuses_an_existing_workdir(tmp_path, leftover):
  # A workdir holding a finished benchmark, or one run of an interrupted one, is refused before
  # anything is trained or written.
  workdir = tmp_path / "bench"
  workdir.mkdir()
  if leftover.endswith(".json"):
    (workdir / leftover).write_text("{}")
  else:
    (workdir / leftover).mkdir()
  listing = sorted(os.listdir(workdir))
  with pytest.raises(ValueError, match="already holds benchmark runs"):
    benchmark.run_benchmark(benchmark_cfg.get_config("quick"), str(workdir))
  assert sorted(os.listdir(workdir)) == listing
