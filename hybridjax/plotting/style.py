"""The figures' shared style: phase colours, the figure and PNG helpers, axis and note helpers.

Saving uses `matplotlib.figure.Figure` directly (the Agg canvas), never pyplot: it works without a
display, leaves the caller's pyplot state alone and leaks no open figures.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from hybridjax.hybrid.phases import Phase

WARMUP, FULL, PREDICT, CORRECT = Phase  # the integers the metrics store


PHASE_COLORS = {"WARMUP": "#bdbdbd", "FULL": "#4c72b0", "PREDICT": "#ee8a35", "CORRECT": "#8e6bbf"}


BAND_ALPHA = 0.28  # opacity of the phase bands: light enough to read the loss over them


_DPI = 110


def step_axis(ax: Axes, label: str = "step") -> None:
  """An x axis of steps: `label`, and round integer ticks."""
  ax.set_xlabel(label)
  # Round ticks as matplotlib's default, but no step 2.5 on short runs.
  ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))


def note(ax: Axes, text: str) -> None:
  """A grey note in the middle of `ax` (e.g. "no predicted steps yet")."""
  ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.4")


def new_figure(width: float, height: float) -> Figure:
  """A figure of `width` x `height` inches with constrained layout, on the Agg canvas (no pyplot)."""
  return Figure(figsize=(width, height), layout="constrained")


def new_axes(width: float, height: float) -> Axes:
  """The one axes of a new `new_figure`; `ax.figure` is the figure to save."""
  return new_figure(width, height).add_subplot()


def legend_or_note(ax: Axes, drawn: bool, text: str, **legend: Any) -> None:
  """A legend (`legend`: its options) where something was `drawn`, else a grey `note` of `text`."""
  if drawn:
    ax.legend(**legend)
  else:
    note(ax, text)


def save_png(fig: Figure, *path: str) -> str:
  """Writes `fig` to the PNG at `path` (its parts joined: a folder and a name, or one path), creating its
  folder; returns the path."""
  path = os.path.join(*path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=_DPI)
  return path


def finite_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(mean, sample std (ddof=1)) of the finite values of each column of a (seeds, n) array.

  A column with no finite value has a NaN mean; one with fewer than 2 has a NaN std.
  """
  finite = np.where(np.isfinite(values), values, np.nan)
  with warnings.catch_warnings():  # numpy warns of the columns with no mean or no std
    warnings.simplefilter("ignore", RuntimeWarning)
    return np.nanmean(finite, axis=0), np.nanstd(finite, axis=0, ddof=1)
