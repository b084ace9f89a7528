"""Figures from any run's workdir: phases, predictions, alphas, velocities, memory, eval curves.

Everything here reads only what `hybridjax.loop.train.train` writes into a workdir:

  metrics.jsonl  one JSON object per line, with "step" and "kind":
                 "train" (every log_every steps), "step" (hybrid: one per step), "eval", "memory"
                 (hybrid: at phase transitions with host dispatch; at the log that saw one, fused)
  summary.json   the run summary (mode, timings, memory, and in hybrid mode phase counts and the
                 names of the parameter groups in the order of every per-group list)

so it works on finished, running, crashed and resumed runs alike, and on runs made by the CLI, the
benchmark or the notebook. The `plot_*` functions draw into a matplotlib `Axes` the caller owns
(they accept a `Run` or a workdir path); `save_run_figures` and `save_comparison_figures` write PNGs.
Saving uses `matplotlib.figure.Figure` directly, i.e. the Agg canvas, never pyplot: it works without a
display, leaves the caller's pyplot state and backend alone and leaks no open figures.

Example:

  from hybridjax import plotting
  run = plotting.load_run("runs/hyb")
  fig, ax = plt.subplots()
  plotting.plot_phase_timeline(ax, run)
  plotting.save_run_figures("runs/hyb")      # -> runs/hyb/plots/*.png
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from hybridjax.hybrid.phases import PHASE_NAMES, Phase
from hybridjax.writers import read_jsonl

WARMUP, FULL, PREDICT, CORRECT = Phase  # the integers the metrics store
PHASE_COLORS = {"WARMUP": "#bdbdbd", "FULL": "#4c72b0", "PREDICT": "#ee8a35", "CORRECT": "#8e6bbf"}
BAND_ALPHA = 0.28  # opacity of the phase bands: light enough to read the loss over them
EVAL_X = {
  "step": "step",
  "train_s": "training seconds (compile, eval, checkpoints excluded)",
  "backward_passes": "backward passes",
}
RUN_FIGURES = (
  "phase_timeline.png",
  "predicted_vs_realised.png",
  "alpha_by_group.png",
  "velocity_norms.png",
  "memory.png",
)
COMPARISON_FIGURES = ("eval_vs_time.png", "eval_vs_backward.png", "memory.png")
_DPI = 110


# --- loading -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
  """One run's metrics, by kind, in step order with one record per (kind, step), and its summary.

  Attributes:
    workdir: the run directory.
    name: a short label (the workdir's base name unless given).
    records: kind ("train", "step", "eval", "memory", ...) -> records sorted by step.
    summary: summary.json, or {} while the run has not finished.
  """

  workdir: str
  name: str
  records: Mapping[str, tuple[dict[str, Any], ...]]
  summary: Mapping[str, Any]

  @property
  def mode(self) -> str:
    """'hybrid' or 'baseline' (from the summary, else from what the metrics hold)."""
    if self.summary.get("mode"):
      return str(self.summary["mode"])
    hybrid = self.records.get("step") or any("phase_now" in r for r in self.records.get("train", ()))
    return "hybrid" if hybrid else "baseline"

  @property
  def is_hybrid(self) -> bool:
    return self.mode == "hybrid"

  def kind(self, kind: str) -> tuple[dict[str, Any], ...]:
    """The records of one kind, in step order (empty if there are none)."""
    return self.records.get(kind, ())

  def series(self, kind: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the records of `kind` that hold a scalar `key`; NaN for non-numbers."""
    recs = [r for r in self.kind(kind) if key in r and not isinstance(r[key], (list, dict))]
    return (np.array([r["step"] for r in recs], np.int64), np.array([_float(r[key]) for r in recs], np.float64))

  def group_names(self, n_groups: int | None = None) -> list[str]:
    """Names of the parameter groups, in the order of every per-group list in the metrics."""
    names = list(self.summary.get("group_names") or [])
    if n_groups is not None and len(names) != n_groups:  # summary missing (run not finished)
      names = [f"group {i}" for i in range(n_groups)]
    return names


def load_run(workdir: str, name: str | None = None) -> Run:
  """Reads `<workdir>/metrics.jsonl` (and `summary.json` if present) into a `Run`.

  A resumed run appends to metrics.jsonl and re-logs the steps after its checkpoint: for every
  kind, a step that goes back marks a restart, and the records it supersedes are dropped, so the
  last record of each step wins. A line cut short by a crash is skipped.

  Raises:
    ValueError: if the workdir holds no metrics.jsonl.
  """
  workdir = os.fspath(workdir)
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(
      f"{workdir!r} has no metrics.jsonl, so it is not a run directory: pass the --workdir of a "
      "`python -m experiments.gpt2_small` run, or one run's folder inside a benchmark workdir"
    )
  lines = read_jsonl(path)
  summary: dict[str, Any] = {}
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.isfile(summary_path):
    with open(summary_path, encoding="utf-8") as f:
      summary = json.load(f)
  return Run(
    workdir=workdir, name=name or os.path.basename(os.path.normpath(workdir)), records=_dedupe(lines), summary=summary
  )


def _dedupe(lines: Iterable[Mapping[str, Any]]) -> dict[str, tuple[dict[str, Any], ...]]:
  by_kind: dict[str, dict[int, dict[str, Any]]] = {}
  last: dict[str, int] = {}
  for rec in lines:
    if not isinstance(rec, dict) or "step" not in rec:
      continue
    kind = rec.get("kind", "train")
    step = int(rec["step"])
    series = by_kind.setdefault(kind, {})
    if kind in last and step <= last[kind]:
      # Steps of one kind only grow within one process: this is a resumed run re-logging from its
      # checkpoint, and everything the crashed process logged from here on is superseded.
      for s in [s for s in series if s >= step]:
        del series[s]
    series[step] = dict(rec)
    last[kind] = step
  return {k: tuple(v[s] for s in sorted(v)) for k, v in by_kind.items()}


def _float(v: Any) -> float:
  """A metric value as a float: the writer stores non-finite numbers as strings ('nan', 'inf')."""
  if v is None:
    return math.nan
  try:
    return float(v)
  except (TypeError, ValueError):
    return math.nan


RunLike = Union[Run, str, "os.PathLike[str]"]


def _as_run(run: RunLike) -> Run:
  return run if isinstance(run, Run) else load_run(run)


def _as_runs(runs: Any) -> dict[str, Run]:
  """A Run, a workdir, a sequence of them, or a name -> Run/workdir mapping, as name -> Run."""
  if isinstance(runs, (Run, str, os.PathLike)):
    runs = [runs]
  if isinstance(runs, Mapping):
    return {str(k): _as_run(v) for k, v in runs.items()}
  out: dict[str, Run] = {}
  for r in runs:
    r = _as_run(r)
    name, i = r.name, 2
    while name in out:  # two workdirs with the same base name
      name, i = f"{r.name} ({i})", i + 1
    out[name] = r
  if not out:
    raise ValueError("no runs given")
  return out


def _require_hybrid(run: Run, what: str) -> None:
  if not run.is_hybrid:
    raise ValueError(
      f"run {run.name!r} ({run.workdir}) is a {run.mode} run: {what} exists only in hybrid mode (--config.mode=hybrid)"
    )


def _trace(run: Run) -> dict[str, np.ndarray]:
  """The per-step trace of a hybrid run as arrays."""
  recs = run.kind("step")
  if not recs:
    raise ValueError(
      f"run {run.name!r} ({run.workdir}) has no per-step records (kind 'step') in "
      "metrics.jsonl yet: they are written at every log step of a hybrid run"
    )

  def get(key: str) -> np.ndarray:
    return np.array([_float(r.get(key)) for r in recs])

  return {
    "step": np.array([r["step"] for r in recs], np.int64),
    "phase": np.array([int(r.get("phase", FULL)) for r in recs], np.int64),
    "loss": get("loss"),
    "predicted_loss": get("predicted_loss"),
    "confidence": get("confidence"),
    "measured": np.array([bool(r.get("measured", True)) for r in recs]),
    "diverged": np.array([bool(r.get("diverged", False)) for r in recs]),
  }


def _segments(steps: np.ndarray, phases: np.ndarray) -> list[tuple[int, int, int]]:
  """Maximal runs of consecutive steps in one phase: (first step, last step, phase)."""
  out: list[tuple[int, int, int]] = []
  for s, p in zip(steps.tolist(), phases.tolist()):
    if out and out[-1][2] == p and out[-1][1] == s - 1:
      out[-1] = (out[-1][0], s, p)
    else:
      out.append((s, s, p))
  return out


def _phase_bands(ax: Axes, steps: np.ndarray, phases: np.ndarray, alpha: float = BAND_ALPHA) -> list[int]:
  """Shades each phase segment (centred on its steps) behind the data; returns the phases seen."""
  for first, last, p in _segments(steps, phases):
    ax.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS[PHASE_NAMES[p]], alpha=alpha, lw=0, zorder=0)
  return sorted(set(phases.tolist()))


def _phase_handles(phases: Iterable[int], alpha: float = 0.5) -> list[Patch]:
  return [Patch(color=PHASE_COLORS[PHASE_NAMES[p]], alpha=alpha, label=PHASE_NAMES[p]) for p in phases]


def _group_style(i: int) -> dict[str, Any]:
  """A distinct colour per group (tab20), with a line style cycle beyond 20 groups."""
  colors = colormaps["tab20"].colors
  return {"color": colors[i % len(colors)], "linestyle": ("-", "--", ":")[(i // len(colors)) % 3]}


def _break_gaps(x: np.ndarray, y: np.ndarray, gap: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Inserts NaNs where consecutive x are more than `gap` apart, so lines do not bridge phases."""
  if len(x) < 2:
    return x.astype(np.float64), y
  cut = np.nonzero(np.diff(x) > gap)[0] + 1
  return np.insert(x.astype(np.float64), cut, np.nan), np.insert(y, cut, np.nan, axis=0)


def _group_legend(ax: Axes, n: int) -> None:
  # Outside the axes on the right: group names are long and the curves fill the plot.
  ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, ncol=1 if n <= 20 else 2)


def _step_axis(ax: Axes, label: str = "step") -> None:
  ax.set_xlabel(label)
  # Round ticks as matplotlib's default, but no step 2.5 on short runs.
  ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))


def _note(ax: Axes, text: str) -> None:
  ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.4")


# --- single-run plots --------------------------------------------------------------------------


def plot_phase_timeline(
  ax: Axes, run: RunLike, *, show_eval: bool = True, window: tuple[int, int] | None = None
) -> Axes:
  """The loss of every step over coloured phase bands (WARMUP, FULL, PREDICT, CORRECT).

  The line joins the measured losses (real steps and validated predicted steps). Predicted steps are
  marked where they are: filled when validated by a forward pass (their loss is real), hollow at the
  predicted loss when not measured, with a red cross where a validation diverged. Held-out eval
  losses are black diamonds. A baseline run has no phases: its logged train loss is drawn alone.

  Args:
    ax: the axes to draw into.
    run: a `Run` or its workdir.
    show_eval: also mark the eval losses.
    window: (first, last) step to zoom into; the loss axis is fitted to the data inside it.
  """
  run = _as_run(run)
  handles: list[Any] = []
  if not run.kind("step"):
    steps, loss = run.series("train", "loss")
    if not len(steps):
      raise ValueError(f"run {run.name!r} ({run.workdir}) has no loss records in metrics.jsonl yet")
    handles += ax.plot(
      steps, loss, color="0.25", lw=1.2, marker="o" if len(steps) < 30 else None, ms=3, label="train loss (logged)"
    )
    ax.set_title(f"{run.name}: {run.mode} (no phases: every step is a real step)")
    seen: list[int] = []
  else:
    t = _trace(run)
    s, phase, loss, measured = t["step"], t["phase"], t["loss"], t["measured"]
    seen = _phase_bands(ax, s, phase)
    m = measured & np.isfinite(loss)
    handles += ax.plot(s[m], loss[m], color="0.2", lw=0.7, zorder=2, label="measured loss")
    pred = phase == PREDICT
    if np.any(pred & measured):
      ax.scatter(
        s[pred & measured],
        loss[pred & measured],
        s=14,
        color=PHASE_COLORS["PREDICT"],
        edgecolor="black",
        linewidth=0.5,
        zorder=4,
      )
      handles.append(
        Line2D(
          [],
          [],
          ls="",
          marker="o",
          ms=5,
          mfc=PHASE_COLORS["PREDICT"],
          mec="black",
          mew=0.5,
          label="predicted step, validated",
        )
      )
    if np.any(pred & ~measured):
      ax.scatter(
        s[pred & ~measured],
        t["predicted_loss"][pred & ~measured],
        s=16,
        facecolor="white",
        edgecolor=PHASE_COLORS["PREDICT"],
        linewidth=1.0,
        zorder=4,
      )
      handles.append(
        Line2D(
          [],
          [],
          ls="",
          marker="o",
          ms=5,
          mfc="white",
          mec=PHASE_COLORS["PREDICT"],
          label="predicted step, not measured (predicted loss)",
        )
      )
    if np.any(t["diverged"]):
      ax.scatter(s[t["diverged"]], loss[t["diverged"]], s=30, marker="x", color="#d62728", linewidth=1.2, zorder=5)
      handles.append(Line2D([], [], ls="", marker="x", ms=6, color="#d62728", mew=1.2, label="validation diverged"))
    _, bwd = run.series("train", "backward_passes")  # micro-corrections are real steps in PREDICT
    bwd_text = f", {int(bwd[-1])} backward passes" if len(bwd) and np.isfinite(bwd[-1]) else ""
    ax.set_title(f"{run.name}: phases over the loss ({int(pred.sum())} of {len(s)} steps in PREDICT{bwd_text})")
  if show_eval:
    es, ev = run.series("eval", "eval_loss")
    if len(es):
      ax.scatter(es, ev, marker="D", s=22, color="black", zorder=6)
      handles.append(Line2D([], [], ls="", marker="D", ms=5, color="black", label="eval loss (held out)"))
  ax.legend(handles=handles + _phase_handles(seen), fontsize=7.5, loc="upper right", ncol=2)
  _step_axis(ax)
  ax.set_ylabel("loss")
  ax.margins(x=0.01)
  if window is not None:
    _zoom(ax, window)
  return ax


def _zoom(ax: Axes, window: tuple[int, int]) -> None:
  """Limits the x axis to `window` and fits the y axis to the plotted data inside it."""
  lo, hi = window
  ys = []
  for line in ax.get_lines():
    x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    ys.append(y[(x >= lo) & (x <= hi)])
  for coll in ax.collections:
    off = np.asarray(coll.get_offsets(), float)
    if off.ndim == 2 and off.shape[1] == 2:
      ys.append(off[(off[:, 0] >= lo) & (off[:, 0] <= hi), 1])
  y = np.concatenate(ys) if ys else np.array([])
  y = y[np.isfinite(y)]
  ax.set_xlim(lo - 0.5, hi + 0.5)
  if len(y):
    pad = 0.08 * max(float(y.max() - y.min()), 1e-3)
    # Headroom at the top for the legend.
    ax.set_ylim(float(y.min()) - pad, float(y.max()) + 6 * pad)


def prediction_pairs(run: RunLike) -> dict[str, np.ndarray]:
  """Predicted and realised loss of every measured step of a hybrid run, aligned in time.

  A predicted step's record holds its own prediction and, when validated, the loss measured after
  its move: that pair is used as is. A real step's record holds the one-step-ahead prediction the
  step made *for the next step* (`exp(plan_logloss[0])`), so a real step's realised loss is paired
  with the prediction of the real step before it.

  Returns:
    Arrays step, phase (of the measured step), predicted, realised and confidence (at the time of
    the prediction).
  """
  run = _as_run(run)
  _require_hybrid(run, "a predicted loss")
  t = _trace(run)
  s, phase = t["step"], t["phase"]
  is_pred = phase == PREDICT
  own = is_pred & t["measured"]
  prev_real = np.zeros_like(own)
  prev_real[1:] = (~is_pred[1:]) & (~is_pred[:-1]) & (np.diff(s) == 1)
  idx_own = np.nonzero(own)[0]
  idx_real = np.nonzero(prev_real)[0]
  idx = np.concatenate([idx_own, idx_real])
  src = np.concatenate([idx_own, idx_real - 1])  # where the prediction (and confidence) came from
  order = np.argsort(s[idx], kind="stable")
  idx, src = idx[order], src[order]
  out = {
    "step": s[idx],
    "phase": phase[idx],
    "predicted": t["predicted_loss"][src],
    "realised": t["loss"][idx],
    "confidence": t["confidence"][src],
  }
  ok = np.isfinite(out["predicted"]) & np.isfinite(out["realised"])
  return {k: v[ok] for k, v in out.items()}


def _after_warmup(p: dict[str, np.ndarray], include_warmup: bool) -> dict[str, np.ndarray]:
  # During WARMUP nothing is predicted and the loss falls fast: those points would set the axes.
  if include_warmup or not np.any(p["phase"] != WARMUP):
    return p
  keep = p["phase"] != WARMUP
  return {k: v[keep] for k, v in p.items()}


def plot_predicted_vs_realised(
  ax: Axes, run: RunLike, *, color_by: str = "phase", include_warmup: bool = False
) -> Axes:
  """Scatter of predicted against realised loss for measured steps, with the y = x line.

  Args:
    ax: the axes to draw into.
    run: a hybrid `Run` or its workdir.
    color_by: 'phase' (one colour per phase, with the median relative error in the legend) or
      'confidence' (a colour bar).
    include_warmup: also show WARMUP steps (by default they are left out once there are others).
  """
  if color_by not in ("phase", "confidence"):
    raise ValueError(f"color_by must be 'phase' or 'confidence', got {color_by!r}")
  run = _as_run(run)
  p = _after_warmup(prediction_pairs(run), include_warmup)
  if not len(p["step"]):
    _note(ax, "no measured predictions yet")
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
  lo = float(np.nanmin([p["predicted"].min(), p["realised"].min()]))
  hi = float(np.nanmax([p["predicted"].max(), p["realised"].max()]))
  ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.8, ls="--", zorder=1, label="_y=x")
  ax.set_xlabel("predicted loss")
  ax.set_ylabel("realised loss")
  ax.set_title(f"{run.name}: predicted vs realised loss")
  return ax


def plot_prediction_over_steps(ax: Axes, run: RunLike, *, include_warmup: bool = False) -> tuple[Axes, Axes]:
  """Realised and predicted loss over steps (as `prediction_pairs` aligns them), with the
  controller's confidence on a twin axis and the PREDICT segments shaded.

  Args:
    ax: the axes to draw into.
    run: a hybrid `Run` or its workdir.
    include_warmup: also show WARMUP steps (by default they are left out once there are others).

  Returns:
    (ax, the twin axis holding the confidence).
  """
  run = _as_run(run)
  p = _after_warmup(prediction_pairs(run), include_warmup)
  t = _trace(run)
  if not include_warmup and np.any(t["phase"] != WARMUP):
    t = {k: v[t["phase"] != WARMUP] for k, v in t.items()}
  pred = t["phase"] == PREDICT
  seen = sorted(set(t["phase"][pred].tolist()))
  _phase_bands(ax, t["step"][pred], t["phase"][pred], alpha=0.3)
  few = {"marker": "o", "ms": 3} if len(p["step"]) < 30 else {}
  ax.plot(p["step"], p["realised"], color="0.25", lw=0.7, label="realised loss", **few)
  ax.plot(p["step"], p["predicted"], color="#1f77b4", lw=0.9, alpha=0.85, label="predicted loss", **few)
  _step_axis(ax)
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
  run = _as_run(run)
  _require_hybrid(run, "alpha")
  recs = [r for r in run.kind("step") if int(r.get("phase", -1)) == PREDICT and r.get("alpha")]
  if not recs:
    _note(ax, "no predicted steps in this run (yet)")
    ax.set_title(f"{run.name}: alpha per parameter group")
    return ax
  steps = np.array([r["step"] for r in recs], np.int64)
  alpha = np.array([[_float(a) for a in r["alpha"]] for r in recs])
  names = run.group_names(alpha.shape[1])
  x, y = _break_gaps(steps, alpha)
  for g, name in enumerate(names):
    ax.plot(x, y[:, g], marker="o", ms=2.5, lw=0.9, label=name, **_group_style(g))
  ax.axhline(0.0, color="0.5", lw=0.6)
  _step_axis(ax, "step (predicted steps only)")
  ax.set_ylabel("alpha (scale of velocity)")
  ax.set_title(f"{run.name}: alpha per parameter group ({len(recs)} predicted steps)")
  _group_legend(ax, len(names))
  return ax


def plot_velocity_norms(ax: Axes, run: RunLike) -> Axes:
  """The L2 norm of the velocity (EMA of real updates) per parameter group, at every log step."""
  run = _as_run(run)
  _require_hybrid(run, "the velocity")
  recs = [r for r in run.kind("train") if r.get("velocity_norm")]
  if not recs:
    _note(ax, "no velocity norms logged yet")
    return ax
  steps = np.array([r["step"] for r in recs], np.int64)
  norms = np.array([[_float(v) for v in r["velocity_norm"]] for r in recs])
  names = run.group_names(norms.shape[1])
  for g, name in enumerate(names):
    ax.plot(steps, norms[:, g], lw=1.0, marker="o" if len(steps) < 30 else None, ms=2.5, label=name, **_group_style(g))
  if np.all(norms[np.isfinite(norms)] > 0):
    ax.set_yscale("log")
  _step_axis(ax)
  ax.set_ylabel("||velocity_g||")
  ax.set_title(f"{run.name}: velocity norm per parameter group")
  _group_legend(ax, len(names))
  return ax


def memory_series(run: RunLike) -> tuple[np.ndarray, np.ndarray]:
  """(steps, bytes_in_use) from the log records and the phase-transition readings, by step."""
  run = _as_run(run)
  pts: dict[int, float] = {}
  for kind in ("memory", "train"):  # a log reading wins over a transition reading at one step
    s, b = run.series(kind, "bytes_in_use")
    pts.update(zip(s.tolist(), b.tolist()))
  steps = np.array(sorted(pts), np.int64)
  return steps, np.array([pts[s] for s in steps.tolist()], np.float64)


def plot_memory(ax: Axes, runs: Any) -> Axes:
  """Memory in use (MiB) against step for one or several runs.

  Args:
    ax: the axes to draw into.
    runs: a `Run` or workdir, a sequence of them, or a mapping name -> Run (or workdir).
  """
  runs = _as_runs(runs)
  drawn = 0
  for i, (name, run) in enumerate(runs.items()):
    steps, b = memory_series(run)
    if not len(steps):
      continue
    source = (run.summary.get("memory") or {}).get("source") or next(
      (r.get("source") for r in run.kind("memory") if r.get("source")), None
    )
    label = f"{name} ({source})" if source else name
    ax.plot(steps, b / 2**20, lw=1.2, marker="o" if len(steps) < 40 else ".", ms=3, color=f"C{i}", label=label)
    drawn += 1
  if not drawn:
    _note(ax, "no memory readings")
  else:
    ax.legend(fontsize=8)
  _step_axis(ax)
  ax.set_ylabel("bytes in use (MiB)")
  ax.set_title("memory in use")
  ax.ticklabel_format(axis="y", useOffset=False)  # flat memory must read as flat, not as +1e-6
  return ax


def eval_curve(run: RunLike, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
  """(x, eval loss) of one run, x in {'step', 'train_s', 'backward_passes'}.

  train_s and backward_passes come from the train record at each eval step (eval steps are
  multiples of log_every; otherwise they are interpolated between log steps). train_s restarts at
  0 when a run resumes; it is made cumulative again here. A baseline's backward passes are its steps.
  """
  if x not in EVAL_X:
    raise ValueError(f"x must be one of {list(EVAL_X)}, got {x!r}")
  run = _as_run(run)
  es, ev = run.series("eval", "eval_loss")
  if x == "step" or not len(es) or (x == "backward_passes" and not run.is_hybrid):
    return es.astype(np.float64), ev
  ts, tv = run.series("train", x)
  ok = np.isfinite(tv)
  ts, tv = ts[ok], tv[ok]
  if not len(ts):
    raise ValueError(f"run {run.name!r} ({run.workdir}) logs no {x!r} in its train records")
  if x == "train_s":
    tv = _cumulative(tv)
  return np.interp(es, ts, tv), ev


def _cumulative(v: np.ndarray) -> np.ndarray:
  """Undoes the restart of a per-process cumulative counter at each resume."""
  out = v.copy()
  offset = 0.0
  for i in range(1, len(v)):
    if v[i] < v[i - 1]:
      offset += v[i - 1]
    out[i] = v[i] + offset
  return out


def plot_eval_curves(ax: Axes, runs: Mapping[str, RunLike] | Sequence[RunLike], x: str = "step") -> Axes:
  """Held-out eval loss of several runs against 'step', 'train_s' or 'backward_passes'.

  Args:
    ax: the axes to draw into.
    runs: name -> `Run` (or workdir); a sequence is named by the workdirs' base names.
    x: 'step', 'train_s' (cumulative training seconds) or 'backward_passes' (a baseline's = steps).
  """
  if x not in EVAL_X:
    raise ValueError(f"x must be one of {list(EVAL_X)}, got {x!r}")
  runs = _as_runs(runs)
  drawn = 0
  for i, (name, run) in enumerate(runs.items()):
    xs, ev = eval_curve(run, x)
    if not len(xs):
      continue
    label = name if run.mode in name else f"{name} ({run.mode})"
    at = f"{xs[-1]:.1f} s" if x == "train_s" else f"{xs[-1]:.0f}"
    ax.plot(xs, ev, marker="o", ms=4, lw=1.3, color=f"C{i}", label=f"{label}: {ev[-1]:.3f} at {at}")
    drawn += 1
  if not drawn:
    _note(ax, "no eval records")
  else:
    ax.legend(fontsize=8)
  ax.set_xlabel(EVAL_X[x])
  ax.set_ylabel("eval loss (held out)")
  ax.set_title(f"eval loss against {EVAL_X[x].split(' (')[0]}")
  return ax


# --- saving ------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
  return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, out_dir: str, name: str) -> str:
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=_DPI)
  return path


def save_run_figures(workdir: str, out_dir: str | None = None) -> list[str]:
  """Writes one run's figures as PNGs and returns their paths.

  phase_timeline.png and memory.png always; predicted_vs_realised.png (scatter coloured by phase,
  and prediction with confidence over steps), alpha_by_group.png and velocity_norms.png for hybrid
  runs only.

  Args:
    workdir: the run directory.
    out_dir: where to write (created if needed); default `<workdir>/plots`.
  """
  run = load_run(workdir)
  out_dir = out_dir or os.path.join(run.workdir, "plots")
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  steps = [r["step"] for r in run.kind("step")] or [r["step"] for r in run.kind("train")]
  if len(steps) >= 120:
    # A second panel zooms into the last steps, where a whole-run y axis (set by the fast early
    # descent) would flatten the PREDICT/CORRECT cycles into a line.
    fig = _figure(11, 7.4)
    top, bottom = fig.subplots(2, 1, height_ratios=[1, 0.9])
    plot_phase_timeline(top, run)
    last = steps[-1]
    first = max(steps[0], last - min(150, max(60, len(steps) // 4)))
    plot_phase_timeline(bottom, run, window=(first, last))
    bottom.set_title(f"zoom: steps {first}-{last}", fontsize=10)
    bottom.get_legend().remove()
  else:
    fig = _figure(11, 4.6)
    plot_phase_timeline(fig.add_subplot(), run)
  paths.append(_save(fig, out_dir, "phase_timeline.png"))
  if run.is_hybrid and run.kind("step"):
    fig = _figure(13, 4.8)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    plot_predicted_vs_realised(left, run)
    plot_prediction_over_steps(right, run)
    paths.append(_save(fig, out_dir, "predicted_vs_realised.png"))
  if run.is_hybrid:
    fig = _figure(11, 4.6)
    plot_alpha_by_group(fig.add_subplot(), run)
    paths.append(_save(fig, out_dir, "alpha_by_group.png"))
    fig = _figure(11, 4.6)
    plot_velocity_norms(fig.add_subplot(), run)
    paths.append(_save(fig, out_dir, "velocity_norms.png"))
  fig = _figure(8, 4)
  plot_memory(fig.add_subplot(), {run.name: run})
  paths.append(_save(fig, out_dir, "memory.png"))
  return paths


def save_comparison_figures(runs: Mapping[str, RunLike] | Sequence[RunLike], out_dir: str) -> list[str]:
  """Writes eval_vs_time.png, eval_vs_backward.png and memory.png comparing `runs`; returns paths.

  Args:
    runs: name -> `Run` (or workdir); a sequence is named by the workdirs' base names.
    out_dir: where to write (created if needed).
  """
  runs = _as_runs(runs)
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for x, name in (("train_s", "eval_vs_time.png"), ("backward_passes", "eval_vs_backward.png")):
    fig = _figure(8, 4.5)
    plot_eval_curves(fig.add_subplot(), runs, x)
    paths.append(_save(fig, out_dir, name))
  fig = _figure(8, 4.5)
  plot_memory(fig.add_subplot(), runs)
  paths.append(_save(fig, out_dir, "memory.png"))
  return paths


# --- benchmark protocol figures ------------------------------------------------------------------
# experiments/benchmark.py aggregates its runs itself and hands these functions plain numbers (no
# workdirs). Each `plot_*` here writes one PNG and returns its path; the `_*_figure` functions build
# the Figure it saves.


def _save_to(fig: Figure, path: str) -> str:
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=_DPI)
  return path


def _finite_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(mean, sample std (ddof=1), count) of the finite values of each column of a (seeds, n) array.

  A column with no finite value has a NaN mean; one with fewer than 2 has a NaN std.
  """
  ok = np.isfinite(values)
  n = ok.sum(axis=0)
  filled = np.where(ok, values, 0.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = filled.sum(axis=0) / n
    sq = np.where(ok, (values - mean) ** 2, 0.0).sum(axis=0)
    std = np.where(n >= 2, np.sqrt(sq / np.maximum(n - 1, 1)), np.nan)
  return mean, std, n


def _budget_curves_figure(
  budgets: Sequence[int],
  curves: Mapping[str, Mapping[str, Sequence[float]]],
  points: Mapping[str, Mapping[str, float]],
  title: str = "",
) -> Figure:
  """The Figure `plot_budget_curves` saves (see there); validates the input first."""
  x = np.array([_float(b) for b in budgets], np.float64)
  if not len(x):
    raise ValueError("budgets is empty: the budget curves need at least one budget")
  if not np.all(np.isfinite(x) & (x > 0)):
    raise ValueError(f"budgets must be positive numbers of backward passes (the x axis is log scale), got {budgets}")
  anchors: dict[str, np.ndarray] = {}
  for name, seeds in curves.items():
    if not seeds:
      raise ValueError(f"curve {name!r} has no seeds")
    rows = []
    for seed, losses in seeds.items():
      if len(losses) != len(x):
        raise ValueError(
          f"curve {name!r}, seed {seed!r}: {len(losses)} losses for {len(x)} budgets {list(budgets)}; "
          "give one final loss per budget, in the order of budgets"
        )
      rows.append([_float(v) for v in losses])
    anchors[str(name)] = np.array(rows, np.float64)
  pts: dict[str, tuple[float, float, float, float]] = {}
  for name, p in points.items():
    missing = [k for k in ("x", "y") if k not in p]
    if missing:
      raise ValueError(f"point {name!r} has no {' or '.join(repr(k) for k in missing)} (keys: {sorted(p)})")
    px, py = _float(p["x"]), _float(p["y"])
    if not (np.isfinite(px) and px > 0):
      raise ValueError(f"point {name!r}: x (mean backward passes) must be a positive number, got {p['x']!r}")
    xs, ys = _float(p.get("x_std")), _float(p.get("y_std"))
    pts[str(name)] = (px, py, xs if np.isfinite(xs) else 0.0, ys if np.isfinite(ys) else 0.0)

  fig = _figure(8.5, 5.2)
  ax = fig.add_subplot()
  ax.set_xscale("log")
  for i, (name, losses) in enumerate(anchors.items()):
    mean, std, n = _finite_stats(losses)
    color = f"C{i}"
    n_seeds = losses.shape[0]
    over = f"mean ± std over {n_seeds} seeds" if n_seeds >= 2 else "1 seed"
    ax.plot(x, mean, color=color, lw=1.5, marker="o", ms=5, label=f"{name} ({over})")
    if n_seeds >= 2:
      ok = np.isfinite(std)
      ax.fill_between(x, np.where(ok, mean - std, mean), np.where(ok, mean + std, mean), color=color, alpha=0.2, lw=0)
  for j, (name, (px, py, xs, ys)) in enumerate(pts.items()):
    color = f"C{(len(anchors) + j) % 10}"
    ax.errorbar(
      px,
      py,
      xerr=xs,
      yerr=ys,
      fmt="D",
      ms=7,
      color=color,
      mec="black",
      mew=0.6,
      capsize=3,
      lw=1.2,
      zorder=4,
      label=name,
    )
    ax.annotate(name, (px, py), xytext=(6, 6), textcoords="offset points", fontsize=8, color=color)
  if not anchors and not pts:
    _note(ax, "no budget curves or points")
  else:
    ax.legend(fontsize=8, loc="upper right")
  ax.set_xlabel("backward passes (log scale)")
  ax.set_ylabel("final eval loss (held out)")
  ax.set_title(title or "final eval loss against backward passes")
  return fig


def plot_budget_curves(
  path: str,
  budgets: Sequence[int],
  curves: Mapping[str, Mapping[str, Sequence[float]]],
  points: Mapping[str, Mapping[str, float]],
  title: str = "",
) -> str:
  """Final eval loss against backward passes (log x): anchor curves over budgets, and method points.

  Each anchor is a line through the mean over seeds of the final loss at each budget, with markers at
  the budgets and a shaded band of mean ± sample std (ddof=1) over the seeds (no band with one seed).
  Non-finite losses (a diverged run) are left out of the mean and std at their budget. Each method is
  a labelled point at its mean (backward passes, final loss) with error bars of its stds both ways.

  Args:
    path: the PNG to write (its folder is created if needed).
    budgets: the budgets in backward passes, > 0.
    curves: anchor name (e.g. "baseline", "averaged baseline") -> {seed: [final loss at each budget,
      in the order of `budgets`]}.
    points: method name -> {"x": mean backward passes, "x_std", "y": mean final loss, "y_std"}; a
      missing or None std draws no bar that way.
    title: the figure's title (default: a generic one).

  Returns:
    `path`.

  Raises:
    ValueError: on no budgets or a non-positive one, a curve with no seeds or whose length differs
      from `budgets`, or a point without "x"/"y" or with a non-positive x.
  """
  return _save_to(_budget_curves_figure(budgets, curves, points, title), path)


_LR_SWEEP_KEYS = ("lr", "seed", "budget", "loss_raw")


def _lr_sweep_figure(rows: Sequence[Mapping[str, Any]], title: str = "") -> Figure:
  """The Figure `plot_lr_sweep` saves (see there); validates the input first."""
  if not rows:
    raise ValueError("no sweep rows given")
  lines: dict[tuple[Any, Any], dict[float, tuple[float, float | None]]] = {}
  for i, r in enumerate(rows):
    missing = [k for k in _LR_SWEEP_KEYS if k not in r]
    if missing:
      raise ValueError(f"sweep row {i} has no {', '.join(repr(k) for k in missing)} (keys: {sorted(r)})")
    lr = _float(r["lr"])
    if not (np.isfinite(lr) and lr > 0):
      raise ValueError(f"sweep row {i}: lr must be a positive number (the x axis is log scale), got {r['lr']!r}")
    line = lines.setdefault((r["seed"], r["budget"]), {})
    if lr in line:
      raise ValueError(f"sweep rows hold lr {lr:g} twice for seed {r['seed']}, budget {r['budget']}")
    avg = r.get("loss_averaged")
    line[lr] = (_float(r["loss_raw"]), None if avg is None else _float(avg))

  fig = _figure(8.5, 5.2)
  ax = fig.add_subplot()
  ax.set_xscale("log")
  diverged: list[float] = []
  handles: list[Any] = []
  order = sorted(lines, key=lambda k: (_float(k[1]), str(k[1]), _float(k[0]), str(k[0])))  # by budget, then seed
  for i, (seed, budget) in enumerate(order):
    line = lines[(seed, budget)]
    color = f"C{i % 10}"
    lrs = np.array(sorted(line))
    best: list[str] = []
    for col, ls, fill in ((0, "-", color), (1, "--", "white")):
      given = np.array([line[lr][col] is not None for lr in lrs])
      if not np.any(given):
        continue  # no averaged losses for this line
      x, y = lrs[given], np.array([_float(line[lr][col]) for lr in lrs[given]])
      ok = np.isfinite(y)
      diverged += x[~ok].tolist()
      ax.plot(x[ok], y[ok], color=color, ls=ls, lw=1.3, marker="o", ms=3.5, label="_sweep line")
      if np.any(ok):
        b = int(np.argmin(np.where(ok, y, np.inf)))
        ax.scatter([x[b]], [y[b]], marker="*", s=150, color=fill, edgecolor=color, linewidth=1.2, zorder=5)
        best.append(f"{'averaged ' if col else ''}{x[b]:.3g}")
    handles.append(
      Line2D([], [], color=color, lw=1.3, label=f"seed {seed}, budget {budget}: best lr {', '.join(best) or 'none'}")
    )
  handles += [
    Line2D([], [], color="0.3", ls="-", label="raw weights"),
    Line2D([], [], color="0.3", ls="--", label="averaged weights"),
    Line2D([], [], ls="", marker="*", ms=11, mfc="0.3", mec="0.3", label="best lr of a line (hollow: averaged)"),
  ]
  if diverged:
    # A diverged run has no loss to place: crosses along the top of the axes mark its lr.
    ax.scatter(
      diverged, [0.97] * len(diverged), marker="x", s=30, color="#d62728", transform=ax.get_xaxis_transform(), zorder=5
    )
    handles.append(Line2D([], [], ls="", marker="x", color="#d62728", label="diverged (non-finite loss)"))
  # Every lr of the sweep in view (autoscaling sees no diverged run), with a margin on the log axis.
  lo, hi = min(min(line) for line in lines.values()), max(max(line) for line in lines.values())
  pad = (hi / lo) ** 0.05 if hi > lo else 2.0
  ax.set_xlim(lo / pad, hi * pad)
  ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  ax.set_xlabel("peak learning rate (log scale)")
  ax.set_ylabel("final eval loss (held out)")
  ax.set_title(title or "learning-rate sweep: final eval loss against peak learning rate")
  return fig


def plot_lr_sweep(path: str, rows: Sequence[Mapping[str, Any]], title: str = "") -> str:
  """Final eval loss against peak learning rate (log x), one line per (seed, budget) of the sweep.

  Solid lines are the raw weights' losses, dashed the averaged weights' (left out where
  "loss_averaged" is None or absent); a star marks the lowest point of each line (hollow on the
  averaged ones). Runs with a non-finite loss (diverged) are red crosses along the top.

  Args:
    path: the PNG to write (its folder is created if needed).
    rows: one per sweep run: {"lr": float, "seed": int, "budget": int, "loss_raw": float,
      "loss_averaged": float | None}.
    title: the figure's title (default: a generic one).

  Returns:
    `path`.

  Raises:
    ValueError: on no rows, a row missing one of lr/seed/budget/loss_raw, a non-positive lr, or one
      lr twice for a (seed, budget).
  """
  return _save_to(_lr_sweep_figure(rows, title), path)


def _arm_eval_figure(arms: Mapping[str, Sequence[Mapping[str, float]]], title: str = "") -> Figure:
  """The Figure `plot_arm_eval_curves` saves (see there); validates the input first."""
  if not arms:
    raise ValueError("no arms given")
  data: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
  for name, evals in arms.items():
    if not evals:
      raise ValueError(f"arm {name!r} has no eval points")
    for i, e in enumerate(evals):
      missing = [k for k in ("step", "eval_loss_raw") if k not in e]
      if missing:
        raise ValueError(
          f"arm {name!r}, eval point {i} has no {', '.join(repr(k) for k in missing)} (keys: {sorted(e)})"
        )
    evals = sorted(evals, key=lambda e: _float(e["step"]))
    data[str(name)] = (
      np.array([_float(e["step"]) for e in evals]),
      np.array([_float(e["eval_loss_raw"]) for e in evals]),
      np.array([_float(e.get("eval_loss_averaged")) for e in evals]),
    )

  fig = _figure(8.5, 4.8)
  ax = fig.add_subplot()
  for i, (name, (steps, raw, avg)) in enumerate(data.items()):
    color = f"C{i % 10}"
    few = {"marker": "o", "ms": 3.5} if len(steps) < 40 else {}
    ok = np.isfinite(raw)
    last = f": {raw[ok][-1]:.3f} at step {steps[ok][-1]:.0f}" if np.any(ok) else ""
    ax.plot(steps[ok], raw[ok], color=color, ls="-", lw=1.3, label=f"{name}{last}", **few)
    ok = np.isfinite(avg)
    if np.any(ok):
      ax.plot(steps[ok], avg[ok], color=color, ls="--", lw=1.3, label=f"{name} averaged: {avg[ok][-1]:.3f}", **few)
  ax.legend(fontsize=8, loc="upper right")
  _step_axis(ax)
  ax.set_ylabel("eval loss (held out)")
  ax.set_title(title or "eval loss against step (solid: raw weights, dashed: averaged)")
  return fig


def plot_arm_eval_curves(path: str, arms: Mapping[str, Sequence[Mapping[str, float]]], title: str = "") -> str:
  """Eval loss against step of several arms (one seed each): one colour per arm, solid raw weights,
  dashed averaged weights (where "eval_loss_averaged" is given and not None).

  Args:
    path: the PNG to write (its folder is created if needed).
    arms: arm name -> [{"step": int, "eval_loss_raw": float, "eval_loss_averaged": float | None}]
      at each eval of the run (any order).
    title: the figure's title (default: a generic one).

  Returns:
    `path`.

  Raises:
    ValueError: on no arms, an arm with no eval points, or a point missing "step" or "eval_loss_raw".
  """
  return _save_to(_arm_eval_figure(arms, title), path)


__all__ = [
  "Run",
  "load_run",
  "plot_phase_timeline",
  "prediction_pairs",
  "plot_predicted_vs_realised",
  "plot_prediction_over_steps",
  "plot_alpha_by_group",
  "plot_velocity_norms",
  "memory_series",
  "plot_memory",
  "eval_curve",
  "plot_eval_curves",
  "save_run_figures",
  "save_comparison_figures",
  "plot_budget_curves",
  "plot_lr_sweep",
  "plot_arm_eval_curves",
  "PHASE_COLORS",
  "BAND_ALPHA",
  "RUN_FIGURES",
  "COMPARISON_FIGURES",
]
