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
(`hybridjax.bench.runs.keys.run_key`), so re-running with another arm reuses the sweep and the curves.
Outputs: `benchmark.json` (every figure with its raw numbers), `headline.json`, `results.md`, plots.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import ml_collections
from absl import app

from hybridjax import cli
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import family, ladder, recipe, report, specs, timing
from hybridjax.bench.runs.runner import make_runner

_CONFIG_PATH = os.path.join(os.path.dirname(__file__), "configs", "benchmark.py")


def run_benchmark(config: ml_collections.ConfigDict, workdir: str, command: str = "") -> dict[str, Any]:
  """The whole protocol for `config`'s family (or the ladder, with `benchmark.ladder`); writes
  benchmark.json, headline.json, results.md and the plots into `workdir` (and into
  `benchmark.publish` when set)."""
  if config.benchmark.get("ladder", False):
    return ladder.run_ladder(config, workdir, command)
  if config.benchmark.get("recipe", False):
    return recipe.run_recipe(config, workdir, command)
  specs.validate_benchmark(config)
  methods = arms_lib.selected(config)
  os.makedirs(workdir, exist_ok=True)
  t_start = time.perf_counter()
  b = config.benchmark
  notes = family.task_notes(config)
  print(
    f"benchmark {b.preset} {specs.family_name(config)} on task {specs.task_name(config)}: N={config.trainer.steps}; "
    f"workdir {workdir}",
    flush=True,
  )
  for line in notes["lines"]:
    print(line, flush=True)
  with make_runner(config, workdir) as runner:
    trained = family.train_family(config, runner, methods)
  print("--- timing (interleaved, this process)", flush=True)
  timed = timing.time_step_kinds(config, trained["tuning"], methods)
  result = family.family_result(config, trained, timed, methods, command=command, notes=notes, runner=runner)
  result["wall_s"] = time.perf_counter() - t_start
  result["plots"] = report.write_results(result, workdir, b.publish)
  print("\n" + report.markdown(result))
  print(f"benchmark wall time {result['wall_s']:.0f} s; outputs in {workdir}", flush=True)
  return result


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # A trick of the recipe (and R6) leaves a field the command line set as given.
  config = recipe.keep_command_line(_FLAGS[0].value, cli.command_line_fields(sys.argv))
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
  cli.run_app(main)
