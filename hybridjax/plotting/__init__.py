"""Figures from any run's workdir, split by concern:

  runs         reading a workdir (`Run`, `load_run`) and the series figures draw
  phases       a hybrid run's figures (phase timeline, predictions, alphas, velocities) and
               `save_run_figures`
  comparisons  eval curves and memory across runs, `save_comparison_figures`
  style        the shared colours and figure helpers

The `plot_*` functions draw into a matplotlib `Axes` the caller owns (they accept a `Run` or a workdir
path). Every public name is re-exported here:

  from hybridjax import plotting
  run = plotting.load_run("runs/hyb")
  fig, ax = plt.subplots()
  plotting.plot_phase_timeline(ax, run)
  plotting.save_run_figures("runs/hyb")      # -> runs/hyb/plots/*.png
"""

from hybridjax.plotting.comparisons import COMPARISON_FIGURES, plot_eval_curves, plot_memory, save_comparison_figures
from hybridjax.plotting.phases import (
  RUN_FIGURES,
  plot_alpha_by_group,
  plot_phase_timeline,
  plot_predicted_vs_realised,
  plot_prediction_over_steps,
  plot_velocity_norms,
  save_run_figures,
)
from hybridjax.plotting.runs import Run, eval_curve, load_run, memory_series, prediction_pairs
from hybridjax.plotting.style import BAND_ALPHA, PHASE_COLORS

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
  "PHASE_COLORS",
  "BAND_ALPHA",
  "RUN_FIGURES",
  "COMPARISON_FIGURES",
]
