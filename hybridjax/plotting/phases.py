"""A hybrid run's figures: the phase timeline, predicted against realised losses, the alphas and
velocity norms per group, and `save_run_figures`, which writes one run's whole set."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from hybridjax.hybrid.phases import PHASE_NAMES
from hybridjax.plotting.comparisons import plot_memory
from hybridjax.plotting.runs import (
  Run,
  RunLike,
  after_warmup,
  as_float,
  as_run,
  load_run,
  prediction_pairs,
  require_hybrid,
  step_trace,
)
from hybridjax.plotting.style import (
  BAND_ALPHA,
  PHASE_COLORS,
  PREDICT,
  new_figure,
  note,
  save_png,
  step_axis,
)

RUN_FIGURES = (
  "phase_timeline.png",
  "predicted_vs_realised.png",
  "alpha_by_group.png",
  "velocity_norms.png",
  "memory.png",
)


def _phase_bands(ax: Axes, steps: np.ndarray, phases: np.ndarray, alpha: float = BAND_ALPHA) -> list[int]:
  """Shades each maximal run of consecutive steps in one phase (centred on its steps) behind the data; returns
  the phases seen."""
  cut = np.flatnonzero((np.diff(phases) != 0) | (np.diff(steps) != 1)) + 1
  for s, p in zip(np.split(steps, cut), np.split(phases, cut)):
    if len(s):
      ax.axvspan(s[0] - 0.5, s[-1] + 0.5, color=PHASE_COLORS[PHASE_NAMES[p[0]]], alpha=alpha, lw=0, zorder=0)
  return sorted(set(phases.tolist()))


def _phase_handles(phases: Iterable[int]) -> list[Patch]:
  return [Patch(color=PHASE_COLORS[PHASE_NAMES[p]], alpha=0.5, label=PHASE_NAMES[p]) for p in phases]


def _group_style(i: int) -> dict[str, Any]:
  """A distinct colour per group (tab20), with a line style cycle beyond 20 groups."""
  colors = colormaps["tab20"].colors
  return {"color": colors[i % len(colors)], "linestyle": ("-", "--", ":")[(i // len(colors)) % 3]}


def _break_gaps(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Inserts NaNs where consecutive x are more than 1 apart, so lines do not bridge phases."""
  cut = np.nonzero(np.diff(x) > 1)[0] + 1
  return np.insert(x.astype(np.float64), cut, np.nan), np.insert(y, cut, np.nan, axis=0)


def _group_lines(ax: Axes, run: Run, recs: list[dict[str, Any]], key: str, gaps: bool, **style: Any) -> np.ndarray:
  """One line per parameter group of the per-group lists `key` of `recs` against their steps (`gaps`: broken
  where steps are missing), with the groups' legend; returns the values, (records, groups)."""
  steps = np.array([r["step"] for r in recs], np.int64)
  values = np.array([[as_float(v) for v in r[key]] for r in recs])
  names = run.group_names(values.shape[1])
  x, y = _break_gaps(steps, values) if gaps else (steps, values)
  for g, name in enumerate(names):
    ax.plot(x, y[:, g], ms=2.5, label=name, **style, **_group_style(g))
  # Outside the axes on the right: group names are long and the curves fill the plot.
  ncol = 1 if len(names) <= 20 else 2
  ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, ncol=ncol)
  return values


def plot_phase_timeline(ax: Axes, run: RunLike, *, window: tuple[int, int] | None = None) -> Axes:
  """The loss of every step over coloured phase bands (WARMUP, FULL, PREDICT, CORRECT).

  The line joins the measured losses (real steps and validated predicted steps). Predicted steps are
  marked where they are: filled when validated by a forward pass (their loss is real), hollow at the
  predicted loss when not measured, with a red cross where a validation diverged. Held-out eval
  losses are black diamonds. A baseline run has no phases: its logged train loss is drawn alone.

  Args:
    ax: the axes to draw into.
    run: a `Run` or its workdir.
    window: (first, last) step to zoom into; the loss axis is fitted to the data inside it.
  """
  run = as_run(run)
  handles: list[Any] = []
  if not run.kind("step") or run.predicts is False:
    steps, loss = run.series("train", "loss")
    if not len(steps):
      raise ValueError(f"run {run.name!r} ({run.workdir}) has no loss records in metrics.jsonl yet")
    handles += ax.plot(
      steps, loss, color="0.25", lw=1.2, marker="o" if len(steps) < 30 else None, ms=3, label="train loss (logged)"
    )
    what = run.mode if not run.is_hybrid else f"method {run.summary.get('method', '?')!r}, which never predicts"
    ax.set_title(f"{run.name}: {what} (no phases: every step is a real step)")
    seen: list[int] = []
  else:
    t = step_trace(run)
    s, phase, loss, measured = t["step"], t["phase"], t["loss"], t["measured"]
    seen = _phase_bands(ax, s, phase)
    m = measured & np.isfinite(loss)
    handles += ax.plot(s[m], loss[m], color="0.2", lw=0.7, zorder=2, label="measured loss")
    pred, predict_color = phase == PREDICT, PHASE_COLORS["PREDICT"]

    def mark(where: np.ndarray, y: np.ndarray, **style: Any) -> None:  # the steps `where`, at losses `y`
      if np.any(where):
        handles.append(ax.scatter(s[where], y[where], **{"zorder": 4, **style}))

    mark(
      pred & measured,
      loss,
      s=14,
      color=predict_color,
      edgecolor="black",
      linewidth=0.5,
      label="predicted step, validated",
    )
    mark(
      pred & ~measured,
      t["predicted_loss"],
      s=16,
      facecolor="white",
      edgecolor=predict_color,
      linewidth=1.0,
      label="predicted step, not measured (predicted loss)",
    )
    mark(t["diverged"], loss, s=30, marker="x", color="#d62728", linewidth=1.2, zorder=5, label="validation diverged")
    _, bwd = run.series("train", "backward_passes")  # micro-corrections are real steps in PREDICT
    bwd_text = f", {int(bwd[-1])} backward passes" if len(bwd) and np.isfinite(bwd[-1]) else ""
    ax.set_title(f"{run.name}: phases over the loss ({int(pred.sum())} of {len(s)} steps in PREDICT{bwd_text})")
  es, ev = run.series("eval", "eval_loss")
  if len(es):
    handles.append(ax.scatter(es, ev, marker="D", s=22, color="black", zorder=6, label="eval loss (held out)"))
  ax.legend(handles=handles + _phase_handles(seen), fontsize=7.5, loc="upper right", ncol=2)
  step_axis(ax)
  ax.set_ylabel("loss")
  ax.margins(x=0.01)
  if window is not None:
    _zoom(ax, window)
  return ax


def _zoom(ax: Axes, window: tuple[int, int]) -> None:
  """Limits the x axis to `window` and fits the y axis to the plotted data inside it."""
  lo, hi = window
  xy = [np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float) for line in ax.get_lines()]
  xy += [o for c in ax.collections if (o := np.asarray(c.get_offsets(), float)).ndim == 2 and o.shape[1] == 2]
  xy = np.concatenate(xy)  # the timeline has its loss line at least
  y = xy[(xy[:, 0] >= lo) & (xy[:, 0] <= hi) & np.isfinite(xy[:, 1]), 1]
  ax.set_xlim(lo - 0.5, hi + 0.5)
  if len(y):
    pad = 0.08 * max(float(y.max() - y.min()), 1e-3)
    # Headroom at the top for the legend.
    ax.set_ylim(float(y.min()) - pad, float(y.max()) + 6 * pad)


def plot_predicted_vs_realised(ax: Axes, run: RunLike, *, color_by: str = "phase") -> Axes:
  """Scatter of predicted against realised loss for measured steps, with the y = x line. WARMUP steps are
  left out once there are others (`after_warmup`).

  Args:
    ax: the axes to draw into.
    run: a hybrid `Run` or its workdir.
    color_by: 'phase' (one colour per phase, with the median relative error in the legend) or
      'confidence' (a colour bar).
  """
  if color_by not in ("phase", "confidence"):
    raise ValueError(f"color_by must be 'phase' or 'confidence', got {color_by!r}")
  run = as_run(run)
  p = after_warmup(prediction_pairs(run))
  if not len(p["step"]):
    note(ax, "no measured predictions yet")
    return ax
  if color_by == "phase":
    for ph in sorted(set(p["phase"].tolist())):
      m = p["phase"] == ph
      err = np.median(np.abs(p["realised"][m] / p["predicted"][m] - 1.0))
      big = ph == PREDICT  # the few validated predicted steps must stand out from the real ones
      ax.scatter(
        p["predicted"][m],
        p["realised"][m],
        s=22 if big else 8,
        alpha=0.9 if big else 0.5,
        color=PHASE_COLORS[PHASE_NAMES[ph]],
        edgecolor="black" if big else "none",
        linewidth=0.4,
        zorder=3 if big else 2,
        label=f"{PHASE_NAMES[ph]} (n={int(m.sum())}, median |err| {err:.1%})",
      )
    ax.legend(fontsize=7.5, loc="upper left")
  else:
    sc = ax.scatter(
      p["predicted"], p["realised"], c=p["confidence"], cmap="viridis", vmin=0.0, vmax=1.0, s=10, alpha=0.8
    )
    ax.figure.colorbar(sc, ax=ax, label="confidence")
  both = np.concatenate([p["predicted"], p["realised"]])
  lo, hi = float(np.nanmin(both)), float(np.nanmax(both))
  ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.8, ls="--", zorder=1, label="_y=x")
  ax.set_xlabel("predicted loss")
  ax.set_ylabel("realised loss")
  ax.set_title(f"{run.name}: predicted vs realised loss")
  return ax


def plot_prediction_over_steps(ax: Axes, run: RunLike) -> tuple[Axes, Axes]:
  """Realised and predicted loss over steps (as `prediction_pairs` aligns them), with the
  controller's confidence on a twin axis and the PREDICT segments shaded; WARMUP steps left out once
  there are others (`after_warmup`).

  Args:
    ax: the axes to draw into.
    run: a hybrid `Run` or its workdir.

  Returns:
    (ax, the twin axis holding the confidence).
  """
  run = as_run(run)
  p = after_warmup(prediction_pairs(run))
  t = after_warmup(step_trace(run))
  pred = t["phase"] == PREDICT
  seen = _phase_bands(ax, t["step"][pred], t["phase"][pred], alpha=0.3)
  few = {"marker": "o", "ms": 3} if len(p["step"]) < 30 else {}
  ax.plot(p["step"], p["realised"], color="0.25", lw=0.7, label="realised loss", **few)
  ax.plot(p["step"], p["predicted"], color="#1f77b4", lw=0.9, alpha=0.85, label="predicted loss", **few)
  step_axis(ax)
  ax.set_ylabel("loss")
  twin = ax.twinx()
  twin.plot(t["step"], t["confidence"], color="#2ca02c", lw=0.9, alpha=0.8, label="confidence")
  twin.set_ylim(-0.02, 1.02)
  twin.set_ylabel("confidence", color="#2ca02c")
  handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
  ax.legend(handles=handles + _phase_handles(seen), fontsize=7.5, loc="upper right")
  ax.set_title(f"{run.name}: prediction and confidence over steps")
  ax.margins(x=0.01)
  return ax, twin


def plot_alpha_by_group(ax: Axes, run: RunLike) -> Axes:
  """The alpha each predicted step applied, one line per parameter group (gaps between phases)."""
  run = as_run(run)
  require_hybrid(run, "alpha")
  recs = [r for r in run.kind("step") if int(r.get("phase", -1)) == PREDICT and r.get("alpha")]
  if not recs:
    note(ax, "no predicted steps in this run (yet)")
    ax.set_title(f"{run.name}: alpha per parameter group")
    return ax
  _group_lines(ax, run, recs, "alpha", True, marker="o", lw=0.9)
  ax.axhline(0.0, color="0.5", lw=0.6)
  step_axis(ax, "step (predicted steps only)")
  ax.set_ylabel("alpha (scale of velocity)")
  ax.set_title(f"{run.name}: alpha per parameter group ({len(recs)} predicted steps)")
  return ax


def plot_velocity_norms(ax: Axes, run: RunLike) -> Axes:
  """The L2 norm of the velocity (EMA of real updates) per parameter group, at every log step."""
  run = as_run(run)
  require_hybrid(run, "the velocity")
  recs = [r for r in run.kind("train") if r.get("velocity_norm")]
  if not recs:
    note(ax, "no velocity norms logged yet")
    return ax
  norms = _group_lines(ax, run, recs, "velocity_norm", False, lw=1.0, marker="o" if len(recs) < 30 else None)
  if np.all(norms[np.isfinite(norms)] > 0):
    ax.set_yscale("log")
  step_axis(ax)
  ax.set_ylabel("||velocity_g||")
  ax.set_title(f"{run.name}: velocity norm per parameter group")
  return ax


def save_run_figures(workdir: str, out_dir: str | None = None) -> list[str]:
  """Writes one run's figures as PNGs and returns their paths.

  phase_timeline.png and memory.png always; predicted_vs_realised.png (scatter coloured by phase,
  and prediction with confidence over steps) and alpha_by_group.png for hybrid runs whose method can
  predict (`Run.predicts`: not for a method whose control turns PREDICT off, whose phase timeline is
  drawn as a baseline's); velocity_norms.png for runs that log the velocity predictor's norms.

  Args:
    workdir: the run directory.
    out_dir: where to write (created if needed); default `<workdir>/plots`.
  """
  run = load_run(workdir)
  out_dir = out_dir or os.path.join(run.workdir, "plots")
  paths = []

  def save(name: str, plot: Any, width: float = 11, height: float = 4.6) -> None:
    fig = new_figure(width, height)
    plot(fig.add_subplot(), run)
    paths.append(save_png(fig, out_dir, name))

  steps = [r["step"] for r in run.kind("step")] or [r["step"] for r in run.kind("train")]
  if len(steps) >= 120:
    # A second panel zooms into the last steps, where a whole-run y axis (set by the fast early
    # descent) would flatten the PREDICT/CORRECT cycles into a line.
    fig = new_figure(11, 7.4)
    top, bottom = fig.subplots(2, 1, height_ratios=[1, 0.9])
    plot_phase_timeline(top, run)
    last = steps[-1]
    first = max(steps[0], last - min(150, max(60, len(steps) // 4)))
    plot_phase_timeline(bottom, run, window=(first, last))
    bottom.set_title(f"zoom: steps {first}-{last}", fontsize=10)
    bottom.get_legend().remove()
    paths.append(save_png(fig, out_dir, "phase_timeline.png"))
  else:
    save("phase_timeline.png", plot_phase_timeline)
  predicts = run.predicts is not False  # not known yet (a run in progress): drawn, with notes where empty
  if predicts and run.kind("step"):
    fig = new_figure(13, 4.8)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    plot_predicted_vs_realised(left, run)
    plot_prediction_over_steps(right, run)
    paths.append(save_png(fig, out_dir, "predicted_vs_realised.png"))
  if predicts:
    save("alpha_by_group.png", plot_alpha_by_group)
  if any("velocity_norm" in r for r in run.kind("train")):  # the velocity predictor's own log field
    save("velocity_norms.png", plot_velocity_norms)
  save("memory.png", lambda ax, run: plot_memory(ax, {run.name: run}), 8, 4)
  return paths
