"""hybridjax.plotting on real tiny runs (hybrid and baseline) and on hand-written metrics files."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import numpy as np
import plotting_helper
import pytest
from matplotlib.figure import Figure
from plotting_helper import TINY_STEPS, distinct_colors, has_band, tiny_config

from hybridjax import plotting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, jax_cache):
  """One tiny hybrid run and one baseline run (60 steps each), made once for this module."""
  reuse = {m: d for m, d in plotting_helper.NOTEBOOK_RUNS.items() if os.path.isfile(os.path.join(d, "summary.json"))}
  if set(reuse) == {"hybrid", "baseline"}:  # the notebook test trained exactly these already
    return reuse
  from experiments import gpt2_small

  # The session's compilation cache: tests/test_notebook.py trains the same programs inside the
  # notebook, and whichever of the two runs second loads them.
  cache = jax_cache
  root = tmp_path_factory.mktemp("plot_runs")
  out = {}
  for mode in ("hybrid", "baseline"):
    gpt2_small.run(tiny_config(mode, cache), str(root / mode))
    out[mode] = str(root / mode)
  return out


def test_load_run_reads_a_hybrid_run(runs):
  run = plotting.load_run(runs["hybrid"])
  assert run.is_hybrid and run.name == "hybrid"
  steps = [r["step"] for r in run.kind("step")]
  assert steps == list(range(1, TINY_STEPS + 1))
  phases = {r["phase"] for r in run.kind("step")}
  assert phases == {0, 1, 2, 3}, f"the tiny run should go through every phase, got {phases}"
  assert len(run.group_names()) == len(run.kind("train")[-1]["velocity_norm"])
  assert not plotting.load_run(runs["baseline"]).is_hybrid


def test_save_run_figures_hybrid(runs, tmp_path):
  paths = plotting.save_run_figures(runs["hybrid"], str(tmp_path))
  assert [os.path.basename(p) for p in paths] == list(plotting.RUN_FIGURES)
  for p in paths:
    assert os.path.getsize(p) > 10_000, p
    assert distinct_colors(p) > 20, p
  timeline = os.path.join(tmp_path, "phase_timeline.png")
  for phase in plotting.PHASE_COLORS:
    assert has_band(timeline, phase), f"no {phase} band in {timeline}"


def test_save_run_figures_baseline_skips_hybrid_only_plots(runs):
  paths = plotting.save_run_figures(runs["baseline"])  # default: <workdir>/plots
  assert [os.path.basename(p) for p in paths] == ["phase_timeline.png", "memory.png"]
  assert all(p.startswith(os.path.join(runs["baseline"], "plots")) and os.path.getsize(p) > 5_000 for p in paths)
  with pytest.raises(ValueError, match="baseline run"):
    plotting.plot_alpha_by_group(Figure().add_subplot(), runs["baseline"])


def test_comparison_figures_and_eval_axes(runs, tmp_path):
  loaded = {m: plotting.load_run(w) for m, w in runs.items()}
  paths = plotting.save_comparison_figures(loaded, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == list(plotting.COMPARISON_FIGURES)
  assert all(os.path.getsize(p) > 10_000 for p in paths)
  # Eval at steps 50 and 60; the hybrid run spent fewer backward passes than steps, the baseline not.
  steps, _ = plotting.eval_curve(loaded["hybrid"], "step")
  np.testing.assert_array_equal(steps, [50, TINY_STEPS])
  bwd, _ = plotting.eval_curve(loaded["hybrid"], "backward_passes")
  assert bwd[-1] == loaded["hybrid"].summary["backward_passes"] < TINY_STEPS
  np.testing.assert_array_equal(plotting.eval_curve(loaded["baseline"], "backward_passes")[0], [50, TINY_STEPS])
  secs, _ = plotting.eval_curve(loaded["baseline"], "train_s")
  assert 0 < secs[0] < secs[1]
  with pytest.raises(ValueError, match="x must be one of"):
    plotting.plot_eval_curves(Figure().add_subplot(), loaded, x="wall")


def test_prediction_pairs_align_real_steps_one_ahead(runs):
  run = plotting.load_run(runs["hybrid"])
  trace = {r["step"]: r for r in run.kind("step")}
  pairs = plotting.prediction_pairs(run)
  assert len(pairs["step"]) > TINY_STEPS // 2
  for s, pred, real in zip(pairs["step"], pairs["predicted"], pairs["realised"]):
    rec = trace[int(s)]
    assert rec["measured"] and real == pytest.approx(rec["loss"])
    source = rec if rec["phase"] == 2 else trace[int(s) - 1]
    assert pred == pytest.approx(source["predicted_loss"])


def test_missing_metrics_fail_loudly(tmp_path):
  empty = str(tmp_path / "not_a_run")
  os.makedirs(empty)
  ax = Figure().add_subplot()
  for call in (
    lambda: plotting.load_run(empty),
    lambda: plotting.save_run_figures(empty),
    lambda: plotting.plot_phase_timeline(ax, empty),
    lambda: plotting.plot_memory(ax, [empty]),
    lambda: plotting.save_comparison_figures({"x": empty}, str(tmp_path / "out")),
  ):
    with pytest.raises(ValueError, match="no metrics.jsonl"):
      call()
  assert not os.path.exists(tmp_path / "out")


def _write(path, records):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


def test_resumed_run_keeps_the_last_record_of_each_step(tmp_path):
  def step(s, loss, phase=1):
    return {
      "step": s,
      "kind": "step",
      "phase": phase,
      "loss": loss,
      "predicted_loss": loss,
      "confidence": 0.5,
      "horizon": 1,
      "measured": True,
      "diverged": False,
    }

  def train(s, loss, train_s):
    return {"step": s, "kind": "train", "loss": loss, "train_s": train_s}

  # Logs every 2 steps, a checkpoint at step 4, killed during step 8; the writer stores NaN as "nan".
  first = [
    train(2, "nan", 2.0),
    *[step(s, 9.0) for s in (1, 2)],
    train(4, 9.0, 4.0),
    *[step(s, 9.0) for s in (3, 4)],
    train(6, 9.0, 6.0),
    *[step(s, 9.0) for s in (5, 6, 7)],
  ]
  # The resumed process re-runs steps 5 and 6 and counts its training seconds from 0.
  resumed = [train(6, 1.0, 1.0), *[step(s, 1.0) for s in (5, 6)], {"step": 6, "kind": "eval", "eval_loss": 1.5}]
  _write(tmp_path, first + resumed)
  with open(os.path.join(tmp_path, "metrics.jsonl"), "a") as f:
    f.write('{"step": 7, "kind": "st')  # a line cut short by the next kill
  run = plotting.load_run(str(tmp_path))
  assert [(r["step"], r["loss"]) for r in run.kind("step")] == [
    (1, 9.0),
    (2, 9.0),
    (3, 9.0),
    (4, 9.0),
    (5, 1.0),
    (6, 1.0),
  ]
  steps, loss = run.series("train", "loss")
  np.testing.assert_array_equal(steps, [2, 4, 6])
  assert np.isnan(loss[0]) and loss[2] == 1.0
  # train_s restarted in the resumed process; the eval curve makes it cumulative again: 4 + 1.
  np.testing.assert_allclose(plotting.eval_curve(run, "train_s")[0], [5.0])
  assert run.is_hybrid  # from the per-step records, with no summary.json
  fig = Figure()
  plotting.plot_phase_timeline(fig.add_subplot(), run)
  plotting.plot_predicted_vs_realised(fig.add_subplot(), run)
  plotting.plot_alpha_by_group(fig.add_subplot(), run)  # no predicted steps: a note, no error


def test_cli_writes_and_prints_paths(runs, tmp_path, capsys):
  out = str(tmp_path / "figs")
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "scripts", "plot_run.py"),
      runs["hybrid"],
      "--out",
      out,
      "--compare",
      runs["baseline"],
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr
  printed = proc.stdout.split()
  assert len(printed) == len(plotting.RUN_FIGURES) + len(plotting.COMPARISON_FIGURES)
  assert all(os.path.isfile(p) for p in printed)
  assert os.path.join(out, "compare", "eval_vs_backward.png") in printed
  main = runpy.run_path(os.path.join(ROOT, "scripts", "plot_run.py"))["main"]
  assert main([str(tmp_path)]) == 2
  assert "no metrics.jsonl" in capsys.readouterr().err
