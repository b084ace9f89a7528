"""The benchmark protocol's figures (budget curves, LR sweeps, arms' eval curves, the ladder's and
the recipe's), in the run figures' style (`hybridjax.plotting.style`). The benchmark aggregates its
runs itself and hands these functions plain numbers (no workdirs); each `plot_*` writes one PNG and
returns its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from hybridjax.plotting.runs import as_float
from hybridjax.plotting.style import finite_stats, legend_or_note, new_axes, save_png, step_axis


def _require(record: Mapping[str, Any], keys: Sequence[str], what: str, join: str = ", ") -> None:
  """Refuses `record` (`what` names it) where it lacks one of `keys`, naming those it lacks and those it has."""
  missing = [k for k in keys if k not in record]
  if missing:
    raise ValueError(f"{what} has no {join.join(repr(k) for k in missing)} (keys: {sorted(record)})")


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
  x = np.array([as_float(b) for b in budgets], np.float64)
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
      rows.append([as_float(v) for v in losses])
    anchors[str(name)] = np.array(rows, np.float64)
  pts: dict[str, tuple[float, float, float, float]] = {}
  for name, p in points.items():
    _require(p, ("x", "y"), f"point {name!r}", " or ")
    px, py = as_float(p["x"]), as_float(p["y"])
    if not (np.isfinite(px) and px > 0):
      raise ValueError(f"point {name!r}: x (mean backward passes) must be a positive number, got {p['x']!r}")
    errs = (as_float(p.get(k)) for k in ("x_std", "y_std"))
    pts[str(name)] = (px, py, *(e if np.isfinite(e) else 0.0 for e in errs))

  ax = new_axes(8.5, 5.2)
  ax.set_xscale("log")
  for i, (name, losses) in enumerate(anchors.items()):
    mean, std = finite_stats(losses)
    color = f"C{i}"
    n_seeds = losses.shape[0]
    over = f"mean ± std over {n_seeds} seeds" if n_seeds >= 2 else "1 seed"
    ax.plot(x, mean, color=color, lw=1.5, marker="o", ms=5, label=f"{name} ({over})")
    if n_seeds >= 2:
      half = np.nan_to_num(std)  # no band where fewer than 2 seeds have a loss
      ax.fill_between(x, mean - half, mean + half, color=color, alpha=0.2, lw=0)
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
  legend_or_note(ax, bool(anchors or pts), "no budget curves or points", fontsize=8, loc="upper right")
  ax.set_xlabel("backward passes (log scale)")
  ax.set_ylabel("final eval loss (held out)")
  ax.set_title(title or "final eval loss against backward passes")
  return save_png(ax.figure, path)


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
  if not rows:
    raise ValueError("no sweep rows given")
  lines: dict[tuple[Any, Any], dict[float, tuple[float, float | None]]] = {}
  for i, r in enumerate(rows):
    _require(r, ("lr", "seed", "budget", "loss_raw"), f"sweep row {i}")
    lr = as_float(r["lr"])
    if not (np.isfinite(lr) and lr > 0):
      raise ValueError(f"sweep row {i}: lr must be a positive number (the x axis is log scale), got {r['lr']!r}")
    line = lines.setdefault((r["seed"], r["budget"]), {})
    if lr in line:
      raise ValueError(f"sweep rows hold lr {lr:g} twice for seed {r['seed']}, budget {r['budget']}")
    avg = r.get("loss_averaged")
    line[lr] = (as_float(r["loss_raw"]), None if avg is None else as_float(avg))

  ax = new_axes(8.5, 5.2)
  ax.set_xscale("log")
  diverged: list[float] = []
  handles: list[Any] = []
  order = sorted(lines, key=lambda k: (as_float(k[1]), str(k[1]), as_float(k[0]), str(k[0])))  # by budget, then seed
  for i, (seed, budget) in enumerate(order):
    line = lines[(seed, budget)]
    color = f"C{i % 10}"
    best: list[str] = []
    for col, ls, fill in ((0, "-", color), (1, "--", "white")):
      given = [(lr, losses[col]) for lr, losses in sorted(line.items()) if losses[col] is not None]
      if not given:
        continue  # no averaged losses for this line
      x, y = np.array(given).T
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
    handles.append(
      ax.scatter(
        diverged,
        [0.97] * len(diverged),
        marker="x",
        s=30,
        color="#d62728",
        transform=ax.get_xaxis_transform(),
        zorder=5,
        label="diverged (non-finite loss)",
      )
    )
  # Every lr of the sweep in view (autoscaling sees no diverged run), with a margin on the log axis.
  lo, hi = min(min(line) for line in lines.values()), max(max(line) for line in lines.values())
  pad = (hi / lo) ** 0.05 if hi > lo else 2.0
  ax.set_xlim(lo / pad, hi * pad)
  ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
  ax.set_xlabel("peak learning rate (log scale)")
  ax.set_ylabel("final eval loss (held out)")
  ax.set_title(title or "learning-rate sweep: final eval loss against peak learning rate")
  return save_png(ax.figure, path)


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
  if not arms:
    raise ValueError("no arms given")
  data: dict[str, np.ndarray] = {}
  for name, evals in arms.items():
    if not evals:
      raise ValueError(f"arm {name!r} has no eval points")
    for i, e in enumerate(evals):
      _require(e, ("step", "eval_loss_raw"), f"arm {name!r}, eval point {i}")
    evals = sorted(evals, key=lambda e: as_float(e["step"]))
    keys = ("step", "eval_loss_raw", "eval_loss_averaged")
    data[str(name)] = np.array([[as_float(e.get(k)) for k in keys] for e in evals]).T  # (steps, raw, averaged)

  ax = new_axes(8.5, 4.8)
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
  step_axis(ax)
  ax.set_ylabel("eval loss (held out)")
  ax.set_title(title or "eval loss against step (solid: raw weights, dashed: averaged)")
  return save_png(ax.figure, path)


def plot_lr_robustness(rows: Sequence[Mapping[str, Any]], method: str, path: str) -> str:
  """Final averaged loss against the LR on each tuning seed: the anchor (dashed) and the method.

  Args:
    rows: one per (LR, seed): "lr", "seed", "anchor_averaged", "final_averaged".
    method: the method's name, for the legend and title.
    path: the PNG to write (its folder is created).

  Returns:
    `path`.
  """
  ax = new_axes(6.4, 4.2)
  for i, seed in enumerate(sorted({r["seed"] for r in rows})):
    mine = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["lr"])
    for key, ls, who in (("anchor_averaged", "--", "anchor"), ("final_averaged", "-", method)):
      ax.plot(
        [r["lr"] for r in mine], [r[key] for r in mine], ls, color=f"C{i}", marker="o", label=f"{who}, seed {seed}"
      )
  ax.set_xscale("log")
  ax.set_xlabel("peak learning rate")
  ax.set_ylabel("final eval loss (averaged params)")
  ax.set_title(f"LR robustness on the tuning seeds: {method} vs the averaged anchor")
  ax.legend(fontsize=8)
  return save_png(ax.figure, path)


def _seed_bars(
  ax: Axes, xs: Sequence[float], per_x: Sequence[Sequence[Any]], color: str, size: float, **bar: Any
) -> int:
  """Each seed's value at each x of `xs` (None: left out) as a dot, and at each x with a value their mean with
  their std (ddof=1; 0 for one seed) as an error bar (`bar`: its options). Whether any x has a value (0 or 1)."""
  at, means, stds = [], [], []
  for x, values in zip(xs, per_x):
    v = np.array([as_float(y) for y in values if y is not None], np.float64)
    if len(v):
      ax.scatter(np.full(len(v), x), v, color=color, s=size, alpha=0.5, zorder=3)
      at.append(x)
      means.append(float(np.mean(v)))
      stds.append(float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)
  if at:
    ax.errorbar(at, means, yerr=stds, color=color, marker="o", capsize=3, zorder=4, **bar)
  return int(bool(at))


def plot_ladder(
  path: str, rungs: Sequence[str], arms: Mapping[str, Mapping[str, Any]], verdict: Sequence[str], ylabel: str
) -> str:
  """Each arm's gain rung by rung: the ratio's mean over seeds with its std as an error bar and each
  seed as a dot; 1.0 (no gain) as a line; the verdict rungs shaded.

  Args:
    path: the PNG to write (its folder is created).
    rungs: the rungs in order (the x axis), as the study names them.
    arms: arm -> rung -> {"values": [per-seed ratio or None]}; a rung an arm was not run at is left
      out.
    verdict: the rungs to shade as the verdict.
    ylabel: what the ratios are, rung by rung (the study's words).

  Returns:
    `path`.

  Raises:
    ValueError: when no arm has a value at any rung.
  """
  ax = new_axes(7.6, 4.4)
  x = {r: i for i, r in enumerate(rungs)}
  for r in verdict:
    if r in x:
      ax.axvspan(x[r] - 0.5, x[r] + 0.5, color="0.9", zorder=0)
  plotted = 0
  width = 0.6 / max(len(arms), 1)
  for i, (arm, per_rung) in enumerate(arms.items()):
    offset, cells = (i - (len(arms) - 1) / 2) * width, {r: c for r, c in per_rung.items() if r in x}
    xs, values = [x[r] + offset for r in cells], [c["values"] for c in cells.values()]
    plotted += _seed_bars(ax, xs, values, f"C{i}", 8, label=arm)
  if not plotted:
    raise ValueError("plot_ladder: no arm has a value at any rung")
  ax.axhline(1.0, color="k", linewidth=0.8, linestyle="--")
  ax.set_xticks(range(len(rungs)), [f"{r}\nverdict" if r in verdict else r for r in rungs])
  ax.set_xlim(-0.5, len(rungs) - 0.5)
  ax.set_ylabel(ylabel)
  ax.set_title("Where each claimed gain goes: the baseline made fair one condition at a time")
  ax.legend(fontsize=8, ncols=2)
  return save_png(ax.figure, path)


def plot_recipe(
  path: str, steps: Sequence[str], per_seed: Sequence[Sequence[float | None]], ylabel: str, title: str = ""
) -> str:
  """The recipe's cumulative speed-up step by step: each seed as a dot, the mean with its std as an
  error bar, on a log axis; 1.0 (the anchor) as a line.

  Args:
    path: the PNG to write (its folder is created).
    steps: the steps in order (the x axis), the anchor first.
    per_seed: for each step, its per-seed speed-up (None where the anchor's curve never reached it).
    ylabel: what a speed-up is measured against (the study's words).
    title: the figure's title.

  Returns:
    `path`.

  Raises:
    ValueError: when `steps` and `per_seed` differ in length, or no step has a value.
  """
  if len(steps) != len(per_seed):
    raise ValueError(f"plot_recipe: {len(steps)} steps but {len(per_seed)} rows of values")
  ax = new_axes(7.6, 4.4)
  if not _seed_bars(ax, range(len(per_seed)), per_seed, "C0", 10):
    raise ValueError("plot_recipe: no step has a value")
  ax.axhline(1.0, color="k", linewidth=0.8, linestyle="--")
  ax.set_yscale("log")
  ax.set_xticks(range(len(steps)), [s.replace("_", "\n") for s in steps], fontsize=8)
  ax.set_ylabel(ylabel)
  ax.set_title(title or "The speedrun recipe, trick by trick (cumulative)")
  return save_png(ax.figure, path)
