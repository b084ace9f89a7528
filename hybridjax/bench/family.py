"""One family's protocol (an optimizer and a schedule): the tuning, the budget curves, the method arms,
the timing, the figures and the result record that benchmark.json holds. `experiments/benchmark.py`
runs it for one family; the ladder (`bench.ladder`) runs it for the cosine families of its rungs.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import ml_collections

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures as figures_lib
from hybridjax.bench import report, specs, tasks, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner


def task_notes(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The task's own report on its data per budget (`benchmark_notes`, when the task has one)."""
  module = tasks.load_task(specs.task_name(config))
  notes = getattr(module, "benchmark_notes", None)
  if notes is None:
    return {"lines": []}
  n = int(config.trainer.steps)
  return notes(specs.experiment_config(config), {str(float(f)): round(f * n) for f in config.benchmark.budgets})


def train_family(config: ml_collections.ConfigDict, runner: Runner, methods: list[str]) -> dict[str, Any]:
  """The family's runs: the LR sweep and checks on the tuning seeds, the budget curves and the
  method arms on the headline seeds. Returns {'tuning', 'curves', 'method_runs'}."""

  def at_chosen_lr(lr: float, beta: float) -> list[dict[str, Any]]:
    print(f"best LR {lr:.4g}, averaging beta {beta}", flush=True)
    return tuning.curve_specs(config, lambda f: lr, beta) + tuning.method_specs(config, methods, lr, beta)

  tuned = tuning.tune(config, runner, also=at_chosen_lr)
  curves = tuning.budget_curves(config, runner, tuned)
  mruns = tuning.method_runs(config, runner, tuned, methods)
  return {"tuning": tuned, "curves": curves, "method_runs": mruns}


def family_result(
  config: ml_collections.ConfigDict,
  trained: dict[str, Any],
  timed: dict[str, Any],
  methods: list[str],
  *,
  command: str,
  notes: dict[str, Any],
  runner: Runner,
) -> dict[str, Any]:
  """benchmark.json's record of one family: every run's numbers, every figure, the headline."""
  b = config.benchmark
  n = int(config.trainer.steps)
  tuned, curves, mruns = trained["tuning"], trained["curves"], trained["method_runs"]
  result: dict[str, Any] = {
    "preset": b.preset,
    "family": specs.family_name(config),
    "task": specs.task_name(config),
    "command": command,
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "code_version": keys.code_versions(config, methods),
    "machine": report.machine_info(),
    "config": json.loads(config.to_json()),
    "steps": n,
    "tuning_seeds": [int(s) for s in b.tuning_seeds],
    "seeds": [int(s) for s in b.seeds],
    "budgets": curves["budgets"],
    "corpus_epochs": notes.get("corpus_epochs"),
    "tuning": tuned,
    "curves": curves["curves"],
    "budget_runs": curves["runs"],
    "method_runs": {m: mruns[m] for m in methods},
    "timing": timed,
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  return result | family_figures(result)


def family_figures(result: dict[str, Any], controls: dict[str, str] | None = None) -> dict[str, Any]:
  """Every figure of a family's record (benchmark.json), from the runs stored in it: the eval errors,
  the anchors' figures and phenomena, every arm's figures (judged with the eval set's paired per-batch
  error besides the seeds'), the headline of its first arm. Pure: `family_result` computes it, and the
  tests and scripts/reread_results.py recompute it from a published benchmark.json.

  `controls` (arm -> its control arm) defaults to those of the record's `benchmark.arms`; a record from
  before the arms were data names them only through its stored comparisons (`vs_skip_control`)."""
  config = ml_collections.ConfigDict(result["config"])
  n, budgets, curves, runs = result["steps"], result["budgets"], result["curves"], result["budget_runs"]
  seeds = sorted({k.split("/")[0] for k in runs}, key=int)
  errors = figures_lib.eval_errors(runs, seeds, budgets, n)
  eval_se = errors["paired_se"]
  methods = list(result.get("figures") or result["method_runs"])  # the headline arm first
  ms = result["timing"]["ms_per_step"]
  figures = {
    m: figures_lib.method_figures(
      curves, result["method_runs"][m], {"baseline": ms["baseline"], "method": ms[m]}, budgets, eval_se
    )
    for m in methods
  }
  if controls is None:
    defined = arms_lib.arms(config)
    controls = {defined[m].control_of: m for m in methods if defined[m].control_of}
  figures_lib.control_comparison(figures, result["method_runs"], controls, eval_se)
  out = {
    "anchor_figures": figures_lib.anchor_figures(curves, budgets, n, eval_se),
    "phenomena": figures_lib.phenomena(curves, runs, budgets, n),
    "eval": errors,
    "figures": figures,
  }
  out["headline"] = figures_lib.headline(result | out, methods[0] if methods else None)
  return out
