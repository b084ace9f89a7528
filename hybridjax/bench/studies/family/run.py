"""One family's protocol (an optimizer and a schedule): its runs, its timing, its record
(benchmark.json); the ladder runs it for its tuned rungs."""

from __future__ import annotations

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import record as record_lib
from hybridjax.bench import specs, tasks, timing, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import Config, Record, Study
from hybridjax.bench.studies.family.figures import family_figures
from hybridjax.bench.studies.family.report import markdown as markdown  # the skeleton prints it
from hybridjax.bench.studies.family.report import write_results


def task_notes(config: Config) -> Record:
  """The task's own report on its data per budget (`benchmark_notes`, when the task has one)."""
  module = tasks.load_task(specs.task_name(config))
  notes = getattr(module, "benchmark_notes", None)
  if notes is None:
    return {"lines": []}
  n = int(config.trainer.steps)
  return notes(specs.experiment_config(config), {str(float(f)): round(f * n) for f in config.benchmark.budgets})


def train_family(config: Config, runner: Runner, methods: list[str]) -> Record:
  """The family's runs: the LR sweep and checks on the tuning seeds, the budget curves and the
  method arms on the headline seeds. Returns {'tuning', 'curves', 'method_runs'}."""

  def at_chosen_lr(lr: float, beta: float) -> list[Record]:
    print(f"best LR {lr:.4g}, averaging beta {beta}", flush=True)
    return tuning.curve_specs(config, lambda f: lr, beta) + tuning.method_specs(config, methods, lr, beta)

  tuned = tuning.tune(config, runner, also=at_chosen_lr)
  curves = tuning.budget_curves(config, runner, tuned)
  mruns = tuning.method_runs(config, runner, tuned, methods)
  return {"tuning": tuned, "curves": curves, "method_runs": mruns}


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  """benchmark.json's record of one family (`trained`: `train`'s, its runs, arms and the task's notes; the
  ladder's tuned groups give theirs alike): every run's numbers, every figure, the headline."""
  b, methods = config.benchmark, trained["methods"]
  tuned, curves, mruns = trained["tuning"], trained["curves"], trained["method_runs"]
  result: Record = record_lib.header(config, command) | {
    "family": specs.family_name(config),
    "code_version": keys.code_versions(config, methods),
    "tuning_seeds": specs.ints(b.tuning_seeds),
    "seeds": specs.ints(b.seeds),
    "budgets": curves["budgets"],
    "corpus_epochs": trained["notes"].get("corpus_epochs"),
    "tuning": tuned,
    "curves": curves["curves"],
    "budget_runs": curves["runs"],
    "method_runs": {m: mruns[m] for m in methods},
    "timing": timed,
    "runs_trained": runner.ran,
    "runs_cached": runner.reused,
  }
  return result | family_figures(result)


RECORD = None  # a family keeps no invocations: its record is rewritten whole


def header(config: Config, workdir: str) -> list[str]:
  return [
    f"benchmark {config.benchmark.preset} {specs.family_name(config)} on task {specs.task_name(config)}: "
    f"N={config.trainer.steps}; arms {','.join(arms_lib.selected(config)) or 'none (the anchors only)'}; "
    f"workdir {workdir}"
  ]


def train(config: Config, runner: Runner) -> Record:
  """The family's runs (`train_family`) for its selected arms, and the task's notes on its data."""
  notes = task_notes(config)
  for line in notes["lines"]:
    print(line, flush=True)
  methods = arms_lib.selected(config)
  return train_family(config, runner, methods) | {"notes": notes, "methods": methods}


def time_steps(config: Config, trained: Record) -> Record:
  return timing.time_step_kinds(config, trained["tuning"], trained["methods"])


def write(result: Record, trained: Record, workdir: str, publish: str) -> None:
  result["plots"] = write_results(result, workdir, publish)


STUDY = Study(header, train, record, markdown, RECORD, time_steps=time_steps, write=write)
