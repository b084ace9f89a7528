"""hybridjax.plotting on real tiny runs (hybrid and baseline; slow, as the notebook test that trains the
same runs) and on hand-written metrics files and figures (fast)."""

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
from hybridjax.bench import plots

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


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
def test_load_run_reads_a_hybrid_run(runs):
  run = plotting.load_run(runs["hybrid"])
  assert run.is_hybrid and run.name == "hybrid"
  steps = [r["step"] for r in run.kind("step")]
  assert steps == list(range(1, TINY_STEPS + 1))
  phases = {r["phase"] for r in run.kind("step")}
  assert phases == {0, 1, 2, 3}, f"the tiny run should go through every phase, got {phases}"
  assert len(run.group_names()) == len(run.kind("train")[-1]["velocity_norm"])
  assert not plotting.load_run(runs["baseline"]).is_hybrid


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
def test_save_run_figures_hybrid(runs, tmp_path):
  paths = plotting.save_run_figures(runs["hybrid"], str(tmp_path))
  assert [os.path.basename(p) for p in paths] == list(plotting.RUN_FIGURES)
  for p in paths:
    assert os.path.getsize(p) > 10_000, p
    assert distinct_colors(p) > 20, p
  timeline = os.path.join(tmp_path, "phase_timeline.png")
  for phase in plotting.PHASE_COLORS:
    assert has_band(timeline, phase), f"no {phase} band in {timeline}"


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
def test_save_run_figures_baseline_skips_hybrid_only_plots(runs):
  paths = plotting.save_run_figures(runs["baseline"])  # default: <workdir>/plots
  assert [os.path.basename(p) for p in paths] == ["phase_timeline.png", "memory.png"]
  assert all(p.startswith(os.path.join(runs["baseline"], "plots")) and os.path.getsize(p) > 5_000 for p in paths)
  with pytest.raises(ValueError, match="baseline run"):
    plotting.plot_alpha_by_group(Figure().add_subplot(), runs["baseline"])


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
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


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
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


@pytest.mark.slow  # trains a hybrid and a baseline GPT-2; the figures' own tests below stay fast
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


# --- benchmark protocol figures (hand-made numbers, no runs) ----------------------------------------

BUDGETS = [100, 200, 400]
CURVES = {
  "baseline": {"0": [4.0, 3.5, 3.0], "1": [4.2, 3.7, 3.2]},
  "averaged baseline": {"0": [3.9, 3.4, 2.9]},  # one seed: a line, no band
}
POINTS = {
  "hybrid": {"x": 150.0, "x_std": 10.0, "y": 3.6, "y_std": 0.1},
  "hybrid averaged": {"x": 160.0, "x_std": 5.0, "y": 3.5, "y_std": 0.05},
}


def _labelled_lines(ax):
  return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def _drawn(monkeypatch, plot, *args):
  """The Figure `plot` (a `plots.plot_*`) draws from `args`, caught where it would be saved."""
  drawn = []
  monkeypatch.setattr(plots, "save_png", lambda fig, path: drawn.append(fig) or path)
  plot("unsaved.png", *args)
  return drawn[0]


def test_budget_curves_png_and_artists(tmp_path, monkeypatch):
  path = str(tmp_path / "sub" / "budget.png")
  assert plots.plot_budget_curves(path, BUDGETS, CURVES, POINTS, title="budgets") == path
  assert os.path.getsize(path) > 10_000
  ax = _drawn(monkeypatch, plots.plot_budget_curves, BUDGETS, CURVES, POINTS).axes[0]
  assert ax.get_xscale() == "log"
  anchors = [line for line in _labelled_lines(ax) if line.get_label().split(" (")[0] in CURVES]
  assert [line.get_label().split(" (")[0] for line in anchors] == list(CURVES)
  np.testing.assert_allclose(anchors[0].get_xdata(), BUDGETS)
  np.testing.assert_allclose(anchors[0].get_ydata(), [4.1, 3.6, 3.1])  # the mean over seeds
  bands = [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
  assert len(bands) == 1, "one band for the two-seed anchor, none for the one-seed one"
  lo, hi = bands[0].get_paths()[0].vertices[:, 1].min(), bands[0].get_paths()[0].vertices[:, 1].max()
  std = np.std([4.0, 4.2], ddof=1)
  assert lo == pytest.approx(3.1 - std) and hi == pytest.approx(4.1 + std)
  bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
  assert [c.get_label() for c in bars] == list(POINTS)
  assert all(c.has_xerr and c.has_yerr for c in bars)
  assert {t.get_text() for t in ax.texts} >= set(POINTS)  # each point is labelled on the plot


def test_budget_curves_reject_bad_input(tmp_path):
  path = str(tmp_path / "bad.png")
  with pytest.raises(ValueError, match=r"'baseline', seed '1': 2 losses for 3 budgets"):
    plots.plot_budget_curves(path, BUDGETS, {"baseline": {"0": [1.0, 2.0, 3.0], "1": [1.0, 2.0]}}, {})
  with pytest.raises(ValueError, match="point 'hybrid' has no 'y'"):
    plots.plot_budget_curves(path, BUDGETS, CURVES, {"hybrid": {"x": 1.0, "x_std": 0.0}})
  with pytest.raises(ValueError, match="budgets must be positive"):
    plots.plot_budget_curves(path, [0, 100, 200], CURVES, POINTS)
  assert not os.path.exists(path)


def _sweep_rows():
  rows = []
  for seed in (0, 1):
    for budget in (100, 200):
      for lr, loss in ((1e-4, 3.5), (3e-4, 3.2), (1e-3, 3.4), (3e-3, float("nan"))):
        avg = None if budget == 200 else loss - 0.4 * (lr == 1e-3)  # averaging prefers a higher lr
        rows.append({"lr": lr, "seed": seed, "budget": budget, "loss_raw": loss + 0.01 * seed, "loss_averaged": avg})
  return rows


def test_lr_sweep_png_and_artists(tmp_path, monkeypatch):
  rows = _sweep_rows()
  path = plots.plot_lr_sweep(str(tmp_path / "sweep.png"), rows, title="sweep")
  assert path == str(tmp_path / "sweep.png") and os.path.getsize(path) > 10_000
  ax = _drawn(monkeypatch, plots.plot_lr_sweep, rows).axes[0]
  assert ax.get_xscale() == "log"
  lines = ax.get_lines()
  # 4 (seed, budget) lines raw; averaged only where given (budget 100): 2 dashed.
  assert sorted(line.get_linestyle() for line in lines) == ["-"] * 4 + ["--"] * 2
  assert all(len(line.get_xdata()) == 3 for line in lines), "the diverged lr is left off every line"
  stars = [c for c in ax.collections if len(c.get_offsets()) == 1]
  best = sorted(tuple(c.get_offsets()[0]) for c in stars)
  assert len(best) == 6
  raw_best = [b for b in best if b[0] == pytest.approx(3e-4)]
  avg_best = [b for b in best if b[0] == pytest.approx(1e-3)]
  assert len(raw_best) == 4 and len(avg_best) == 2
  crosses = [c for c in ax.collections if len(c.get_offsets()) > 1]
  assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 6  # 4 raw + 2 averaged diverged runs
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "seed 0, budget 100: best lr 0.0003, averaged 0.001" in labels
  assert "seed 1, budget 200: best lr 0.0003" in labels
  assert ax.get_xlim()[0] < 1e-4 and ax.get_xlim()[1] > 3e-3, "the diverged lr is in view"


def test_lr_sweep_rejects_bad_rows(tmp_path):
  rows = _sweep_rows()
  del rows[3]["loss_raw"]
  with pytest.raises(ValueError, match="sweep row 3 has no 'loss_raw'"):
    plots.plot_lr_sweep(str(tmp_path / "bad.png"), rows)
  rows = _sweep_rows()
  rows.append(dict(rows[0]))
  with pytest.raises(ValueError, match="lr 0.0001 twice for seed 0, budget 100"):
    plots.plot_lr_sweep(str(tmp_path / "bad.png"), rows)
  with pytest.raises(ValueError, match="lr must be a positive number"):
    plots.plot_lr_sweep(str(tmp_path / "bad.png"), [{"lr": 0.0, "seed": 0, "budget": 1, "loss_raw": 3.0}])
  assert not os.path.exists(tmp_path / "bad.png")


ARMS = {
  "baseline": [
    {"step": 20, "eval_loss_raw": 3.5, "eval_loss_averaged": 3.4},
    {"step": 10, "eval_loss_raw": 4.0, "eval_loss_averaged": 3.9},  # out of order: sorted by step
  ],
  "hybrid": [{"step": 10, "eval_loss_raw": 4.1, "eval_loss_averaged": None}, {"step": 20, "eval_loss_raw": 3.6}],
}


def test_arm_eval_curves_png_and_artists(tmp_path, monkeypatch):
  path = plots.plot_arm_eval_curves(str(tmp_path / "arms.png"), ARMS, title="arms")
  assert path == str(tmp_path / "arms.png") and os.path.getsize(path) > 10_000
  ax = _drawn(monkeypatch, plots.plot_arm_eval_curves, ARMS).axes[0]
  styles = [(line.get_label().split(":")[0], line.get_linestyle(), line.get_color()) for line in ax.get_lines()]
  assert [(n, s) for n, s, _ in styles] == [("baseline", "-"), ("baseline averaged", "--"), ("hybrid", "-")]
  assert styles[0][2] == styles[1][2] != styles[2][2], "one colour per arm"
  np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), [10, 20])
  np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), [4.0, 3.5])


def test_arm_eval_curves_reject_bad_input(tmp_path):
  with pytest.raises(ValueError, match="arm 'hybrid', eval point 1 has no 'eval_loss_raw'"):
    plots.plot_arm_eval_curves(str(tmp_path / "bad.png"), {"hybrid": [{"step": 1, "eval_loss_raw": 3.0}, {"step": 2}]})
  with pytest.raises(ValueError, match="arm 'hybrid' has no eval points"):
    plots.plot_arm_eval_curves(str(tmp_path / "bad.png"), {"hybrid": []})
  assert not os.path.exists(tmp_path / "bad.png")


def _never_predicting_run(path):
  """A finished hybrid run of a method that never predicts (WARMUP then FULL), as train() writes it."""
  steps = [
    {"step": s, "kind": "step", "phase": 0 if s <= 3 else 1, "loss": 2.0 - 0.1 * s, "measured": True}
    for s in range(1, 9)
  ]
  steps = [{**r, "predicted_loss": r["loss"], "confidence": 0.0, "horizon": 1, "diverged": False} for r in steps]
  train = [
    {"step": s, "kind": "train", "loss": 2.0 - 0.1 * s, "train_s": 0.1 * s, "phase_now": 1, "predict_fraction": 0.0}
    for s in (4, 8)
  ]
  _write(path, steps + train)
  summary = {"mode": "hybrid", "method": "selective_backprop", "predicts": False, "phase_steps": {"FULL": 8}}
  with open(os.path.join(path, "summary.json"), "w") as f:
    json.dump(summary, f)


def test_a_method_that_never_predicts_gets_a_baselines_figures(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  _never_predicting_run(workdir)
  run = plotting.load_run(workdir)
  assert run.is_hybrid and run.predicts is False
  main = runpy.run_path(os.path.join(ROOT, "scripts", "plot_run.py"))["main"]
  assert main([workdir]) == 0
  printed = capsys.readouterr().out.split()
  assert [os.path.basename(p) for p in printed] == ["phase_timeline.png", "memory.png"]
  ax = Figure().add_subplot()
  plotting.plot_phase_timeline(ax, run)
  assert (
    ax.get_title() == "run: method 'selective_backprop', which never predicts (no phases: every step is a real step)"
  )
  assert not ax.patches  # no phase bands
  # A run in progress (no summary yet) that has not predicted: not known, its figures drawn with notes.
  os.remove(os.path.join(workdir, "summary.json"))
  assert plotting.load_run(workdir).predicts is None
