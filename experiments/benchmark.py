"""The benchmark protocol: hybrid training against tuned anchors on a budget curve.

  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long        # AdamW-cosine
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:long,muon   # Muon-cosine
  python -m experiments.benchmark --quick                                                # smoke run

What it does, for one (optimizer, schedule) family, on the config's task (`benchmark.task`):

1. LR sweep, on the tuning seeds; the averaging beta; budget checks (`hybridjax.bench.tuning`).
2. Budget curve, on each headline seed: budgets B x N, each with its own warm-up and schedule, each
   reporting the final eval loss of its raw and its averaged params. Those are the two anchors.
3. Method arms (`benchmark.arms`, selected by `benchmark.methods`) at the tuned LR and beta on each
   headline seed, through the library's own `train()`; their model is the averaged params.
4. Timing: each arm's median time per step of each kind, interleaved in this process
   (`hybridjax.bench.timing`).
5. Figures per seed against each anchor (`hybridjax.bench.figures`): backward, pass and wall-clock
   ratios, final-loss gaps, paired differences from the anchors and from each arm's control.

Every run is cached in `<workdir>/cache` under a hash of its spec and of the code it runs
(`hybridjax.bench.keys.run_key`), so re-running with another arm reuses the sweep and the curves.
Outputs: `benchmark.json` (every figure with its raw numbers), `headline.json`, `results.md`, plots.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
from typing import Any

import ml_collections
from absl import app

from hybridjax import cli
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures as figures_lib
from hybridjax.bench import keys, report, specs, tasks, timing, tuning
from hybridjax.bench.runner import Runner

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")


def task_notes(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The task's own report on its data per budget (`benchmark_notes`, when the task has one)."""
  module = tasks.load_task(specs.task_name(config))
  notes = getattr(module, "benchmark_notes", None)
  if notes is None:
    return {"lines": []}
  n = int(config.trainer.steps)
  return notes(specs.experiment_config(config), {str(float(f)): round(f * n) for f in config.benchmark.budgets})


def run_benchmark(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """The whole protocol for `config`'s family; writes benchmark.json, headline.json, results.md and
  the plots into `workdir` (and into `benchmark.publish` when set)."""
  specs.validate_benchmark(config)
  methods = arms_lib.selected(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  b = config.benchmark
  n = int(config.trainer.steps)
  notes = task_notes(config)
  print(f"benchmark {b.preset} {b.family} on task {specs.task_name(config)}: N={n}; workdir {workdir}", flush=True)
  for line in notes["lines"]:
    print(line, flush=True)
  cache = None
  if config.trainer.compile_cache:  # a cold benchmark starts with an empty <workdir>/jax_cache
    cache = config.trainer.compile_cache_dir or os.path.join(os.path.abspath(workdir), "jax_cache")
  runner = Runner(workdir, int(b.workers), cache)
  try:

    def at_chosen_lr(lr: float, beta: float) -> list[dict[str, Any]]:
      print(f"best LR {lr:.4g}, averaging beta {beta}", flush=True)
      return tuning.curve_specs(config, lambda f: lr, beta) + tuning.method_specs(config, methods, lr, beta)

    tuned = tuning.tune(config, runner, also=at_chosen_lr)
    curves = tuning.budget_curves(config, runner, tuned)
    mruns = tuning.method_runs(config, runner, tuned, methods)
  except BaseException:
    runner.close(cancel=True)
    raise
  runner.close()
  print("--- timing (interleaved, this process)", flush=True)
  timed = timing.time_step_kinds(config, tuned, methods)
  figures = {
    m: figures_lib.method_figures(
      curves["curves"],
      mruns[m],
      {"baseline": timed["ms_per_step"]["baseline"], "method": timed["ms_per_step"][m]},
      curves["budgets"],
    )
    for m in methods
  }
  defined = arms_lib.arms(config)
  controls = {defined[m].control_of: m for m in methods if defined[m].control_of}
  figures_lib.control_comparison(figures, mruns, controls)
  n_runs = curves["runs"][f"{b.seeds[0]}/{n}"]
  sampling_se = n_runs["eval_batch_std"] / math.sqrt(n_runs["eval_batches"])
  result: dict[str, Any] = {
    "preset": b.preset,
    "family": b.family,
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
    "method_runs": mruns,
    "timing": timed,
    "anchor_figures": figures_lib.anchor_figures(curves["curves"], curves["budgets"], n),
    "phenomena": figures_lib.phenomena(curves["curves"], curves["runs"], curves["budgets"], n),
    "eval": {"batches": n_runs["eval_batches"], "sampling_se": sampling_se},
    "figures": figures,
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  result["wall_s"] = time.perf_counter() - t_start
  result["headline"] = figures_lib.headline(result, methods[0] if methods else None)
  result["plots"] = report.write_results(result, workdir, b.publish)
  print("\n" + report.markdown(result))
  print(f"benchmark wall time {result['wall_s']:.0f} s; outputs in {workdir}", flush=True)
  return result


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _FLAGS[0].value
  workdir = _FLAGS[1].value or os.path.join("runs", f"benchmark-{config.benchmark.preset}-{config.benchmark.family}")
  command = "python -m experiments.benchmark " + " ".join(sys.argv[1:])
  cli.run_as_program(lambda: run_benchmark(config, workdir, command))


def _expand_quick(argv: list[str]) -> list[str]:
  """`--quick` is short for `--config=experiments/configs/benchmark.py:quick`."""
  if "--quick" not in argv:
    return argv
  if any(a.startswith("--config=") or a == "--config" for a in argv):
    sys.exit("error: pass either --quick or --config=..., not both")
  return [f"--config={_CONFIG_PATH}:quick" if a == "--quick" else a for a in argv]


if __name__ == "__main__":
  # Rewritten before the flags exist: config_flags also reads sys.argv for `--config.*` overrides.
  sys.argv = _expand_quick(sys.argv)
  _FLAGS = cli.define_flags(
    _CONFIG_PATH + ":long",
    "Output folder (default: runs/benchmark-<preset>-<family>); its cache/ is reused by a later run.",
  )
  app.run(main)
