"""Figures that compare runs: eval curves against steps, training seconds or backward passes, and
memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes

from hybridjax.plotting.runs import EVAL_X, RunLike, as_runs, eval_curve, memory_series
from hybridjax.plotting.style import legend_or_note, new_axes, save_png, step_axis

COMPARISON_FIGURES = ("eval_vs_time.png", "eval_vs_backward.png", "memory.png")


def plot_memory(ax: Axes, runs: Any) -> Axes:
  """Memory in use (MiB) against step for one or several runs.

  Args:
    ax: the axes to draw into.
    runs: a `Run` or workdir, a sequence of them, or a mapping name -> Run (or workdir).
  """
  drawn = 0
  for i, (name, run) in enumerate(as_runs(runs).items()):
    steps, b = memory_series(run)
    if not len(steps):
      continue
    source = (run.summary.get("memory") or {}).get("source") or next(
      (r.get("source") for r in run.kind("memory") if r.get("source")), None
    )
    label = f"{name} ({source})" if source else name
    ax.plot(steps, b / 2**20, lw=1.2, marker="o" if len(steps) < 40 else ".", ms=3, color=f"C{i}", label=label)
    drawn += 1
  legend_or_note(ax, drawn, "no memory readings", fontsize=8)
  step_axis(ax)
  ax.set_ylabel("bytes in use (MiB)")
  ax.set_title("memory in use")
  ax.ticklabel_format(axis="y", useOffset=False)  # flat memory must read as flat, not as +1e-6
  return ax


def plot_eval_curves(ax: Axes, runs: Mapping[str, RunLike] | Sequence[RunLike], x: str = "step") -> Axes:
  """Held-out eval loss of several runs against 'step', 'train_s' or 'backward_passes'.

  Args:
    ax: the axes to draw into.
    runs: name -> `Run` (or workdir); a sequence is named by the workdirs' base names.
    x: 'step', 'train_s' (cumulative training seconds) or 'backward_passes' (a baseline's = steps).
  """
  drawn = 0
  for i, (name, run) in enumerate(as_runs(runs).items()):
    xs, ev = eval_curve(run, x)  # refuses an `x` not of `EVAL_X`
    if not len(xs):
      continue
    label = name if run.mode in name else f"{name} ({run.mode})"
    at = f"{xs[-1]:.1f} s" if x == "train_s" else f"{xs[-1]:.0f}"
    ax.plot(xs, ev, marker="o", ms=4, lw=1.3, color=f"C{i}", label=f"{label}: {ev[-1]:.3f} at {at}")
    drawn += 1
  legend_or_note(ax, drawn, "no eval records", fontsize=8)
  ax.set_xlabel(EVAL_X[x])
  ax.set_ylabel("eval loss (held out)")
  ax.set_title(f"eval loss against {EVAL_X[x].split(' (')[0]}")
  return ax


def save_comparison_figures(runs: Mapping[str, RunLike] | Sequence[RunLike], out_dir: str) -> list[str]:
  """Writes eval_vs_time.png, eval_vs_backward.png and memory.png comparing `runs`; returns paths.

  Args:
    runs: name -> `Run` (or workdir); a sequence is named by the workdirs' base names.
    out_dir: where to write (created if needed).
  """
  runs = as_runs(runs)
  paths = []
  for name, x in zip(COMPARISON_FIGURES, ("train_s", "backward_passes", None)):
    ax = new_axes(8, 4.5)
    if x is None:
      plot_memory(ax, runs)
    else:
      plot_eval_curves(ax, runs, x)
    paths.append(save_png(ax.figure, out_dir, name))
  return paths
