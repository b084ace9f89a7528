"""Run specs as plain data (what a run trains and records: the whole experiment config, the task,
the arm) and the checks on the benchmark block. A spec's cache key is `keys.run_key`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from hybridjax import config as config_lib
from hybridjax import fields, preflight, schema
from hybridjax import optim as optim_lib
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import speedrun
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.studies import STUDIES, Config, Record
from hybridjax.optimizers import user as user_optimizer
from hybridjax.tasks import gpt2 as gpt2_task
from hybridjax.tasks import mlp as mlp_task

# How the runs are trained (`benchmark.executor`, `hybridjax.bench.runs.runner`): never part of what a run is.
EXECUTORS = ("local", "ray")
# The studies' fields once flat in the benchmark block, and where they live now (their study's block,
# `benchmark.<study>`): refused from Python (`BenchmarkBlock`), renamed with a warning on the command line
# (experiments/benchmark.py), read in the records written before (`record.stored_config`).
MOVED = {f"ladder_{f}": f"ladder.{f}" for f in ("rungs", "methods", "cosine_methods")}
MOVED |= {f: f"ladder.{f}" for f in ("untuned_lr", "constant_eval_points", "muon")}
MOVED |= {f"recipe_{f}": f"recipe.{f}" for f in ("tricks", "keep", "muon_lr", "budgets", "budget_extensions")}
OLD_FLAGS = ("ladder", "recipe")  # `benchmark.ladder=True` / `recipe=True`: `benchmark.study` before it existed
ITERATES = ("averaged", "best")  # `benchmark.iterate`: what the tuning ranks runs by
BENCHMARK_MODE = "benchmark"  # a benchmark config's `mode`: informational, each run sets its own


def ints(values: Sequence[Any]) -> list[int]:
  """`values` (seeds: a config's tuple, a record's list) as ints."""
  return [int(v) for v in values]


def plateau_extension(config: Config) -> tuple[list[int], list[int]]:
  """(the headline seeds, the plateau seeds not among them: those the plateau rule adds)."""
  seeds = ints(config.benchmark.seeds)
  return seeds, [s for s in ints(config.benchmark.plateau_seeds) if s not in seeds]


def refuse(errors: Sequence[str]) -> None:
  """Raises ValueError with every line of `errors`, if any: each names its field and the fix."""
  if errors:
    raise ValueError("; ".join(errors))


def _seed_tuple(v: Any) -> str | None:
  """A tuple of seeds (ints >= 0), empty allowed."""
  if not isinstance(v, (tuple, list)) or not all(fields.is_int(x) and x >= 0 for x in v):
    return f"must be a tuple of seeds (integers >= 0), e.g. (1, 2, 3), got {v!r}"
  return None


def _iterate(v: Any) -> str | None:
  if v in ITERATES:
    return None
  return (
    "must be 'averaged' (the tuning ranks runs by their averaged loss) or 'best' (by each run's better "
    f"iterate, raw or averaged), got {v!r}"
  )


def _tuner(v: Any) -> str | None:
  """`benchmark.tuner`: the LR sweep (`tuning`, every study's) or the joint search (`search`, where a study's
  `studies.Study.tuners` names it)."""
  if v in ("lr", "joint"):
    return None
  return (
    "must be 'lr' (the LR sweep and the averaging beta) or 'joint' (the joint search over a side's knobs, "
    f"where the study runs it), got {v!r}"
  )


def _cpus(v: Any) -> str | None:
  return None if fields.is_num(v) and v > 0 else f"must be a positive number of CPUs per run, got {v!r}"


def _gpu_share(v: Any) -> str | None:
  if not fields.is_num(v) or v < 0 or (v > 1 and v != int(v)):
    return f"must be 0 (no GPU), a share of one GPU in (0, 1], or a whole number, got {v!r}"
  return None


# The benchmark block's own fields, besides the study blocks (`study.add_defaults`) and the arms (an
# open block): experiments/configs/benchmark.py builds the block from them and sets a preset's own
# values; a key outside them is a typo, refused (`unknown_benchmark_fields`). `runtime='host'`: how
# and where a study runs and where it is published, never what it measures (`record.RUNTIME`).
F = schema.Field
BENCHMARK_FIELDS = (
  F("preset", "long", fields.check_name, "the preset (experiments/configs/benchmark.py): quick, tiny, long, deep, "
    "124m"),
  F("family", "adamw-cosine", fields.check_name, "the family's name, `<optim.name>-<optim.schedule>` (the preset "
    "sets it)"),
  F("tuning_seeds", (1001, 1002), _seed_tuple, "the seeds the LR, the averaging beta and any method setting are "
    "chosen on; the headline figures come from the other seeds (a seed fixes the init and the data order)"),
  F("seeds", (1, 2, 3), _seed_tuple, "the headline seeds"),
  F("lr_points", 5, fields.check_int(3), "the LR sweep's first grid: this many LRs on a sqrt(2) grid around "
    "optim.learning_rate"),
  F("lr_max_extensions", 3, fields.check_int(0), "grid points added, one at a time, while the best LR sits at an edge"),
  F("budgets", (0.5, 0.75, 1.0, 1.25, 1.5, 2.0), fields.check_num_tuple(0.0), "the anchors' budgets, x "
    "trainer.steps (= N), each its own schedule; 1.0 among them"),
  F("betas", (0.99, 0.995, 0.998), fields.check_num_tuple(0.0), "the averaging betas tried on the tuning seeds"),
  F("task", "gpt2", fields.check_name, "the task (`hybridjax.bench.tasks`): 'gpt2', 'mlp', or a module path of "
    "your own"),
  F("methods", "", fields.check_str, "the arms the benchmark runs (`benchmark.arms`), comma-separated, the "
    "headline's first; '' = anchors only"),
  F("executor", "local", fields.check_choice(*EXECUTORS), "who trains the runs: 'local' (worker processes on this "
    "machine) or 'ray' (each run a Ray task, the `cluster` extra); never part of a run's key", runtime="host"),
  F("workers", 2, fields.check_int(1), "local: runs in parallel processes, one CPU core each (1 = in this "
    "process; use 1 on a GPU)", runtime="host"),
  F("cpus_per_run", 1.0, _cpus, "ray: CPUs each run's task reserves (XLA:CPU "
    "runs one thread either way)", runtime="host"),
  F("gpus_per_run", 0.0, _gpu_share, "ray: GPUs per run; a share such as 0.25 packs 4 runs on one GPU; 0 = on "
    "the CPU", runtime="host"),
  F("ray_address", "", fields.check_str, "ray: '' starts Ray on this machine; 'auto' or 'host:port' joins a "
    "running cluster", runtime="host"),
  F("eval_points", 10, fields.check_int(1), "evals over each run, for the eval curves (the final eval is always one)"),
  F("timing_rounds", 12, fields.check_int(1), "interleaved timing: rounds of each arm's steps, in one process"),
  F("timing_steps", 25, fields.check_int(1), "steps per arm and round"),
  F("publish", "", fields.check_str, "a folder to copy the study's record, markdown and plots into ('' = none)",
    runtime="host"),
  F("study", "family", fields.check_name, f"the study (`hybridjax/bench/studies/`): {', '.join(map(repr, STUDIES))}; "
    "'family' is one family's protocol", runtime="host"),
  F("plateau_margin", 0.05, fields.check_num(0.0, lo_open=True), "the plateau rule (the ladder's and the "
    "recipe's): a run this far (relative) above its group's median eval loss at N/10 or N is a plateau"),
  F("plateau_seeds", (4, 5), _seed_tuple, "headline seeds added to a group with a plateau run"),
  F("iterate", "averaged", _iterate, "what the tuning ranks runs by: 'averaged', or "
    "'best' (each run's better iterate, raw or averaged)"),
  F("tuner", "lr", _tuner, "'lr': the LR sweep (`bench/tuning.py`); 'joint': the joint "
    "search (`bench/search.py`), where the study runs it"),
)  # fmt: skip
del F
FIELDS = tuple(f.name for f in BENCHMARK_FIELDS) + ("arms",)
RUNTIME = tuple(f.name for f in BENCHMARK_FIELDS if f.runtime == "host")


@dataclasses.dataclass(frozen=True)
class Overwritten:
  """An experiment field the benchmark sets per run (`specs.run_spec`, the tuning): why and the fix,
  and its value in every preset of experiments/configs/benchmark.py where all presets give it one
  (`PER_PRESET` where they differ: then only the command line is checked)."""

  why: str
  preset_value: Any


PER_PRESET = object()  # an `Overwritten.preset_value`: the presets give the field different values
# Given on the command line (or, from Python, away from every preset's value), they are refused, not ignored.
OVERWRITTEN = {
  "seed": Overwritten(
    "the benchmark sets each run's seed from --config.benchmark.seeds (headline) and "
    "--config.benchmark.tuning_seeds (tuning): leave out --config.seed and set those",
    schema.by_name(config_lib.TOP_FIELDS)["seed"].default,
  ),
  "mode": Overwritten(
    "the benchmark sets each run's mode (the anchors train the baseline loop, each method arm in its "
    "arm's mode): leave out --config.mode and name the methods to run in --config.benchmark.methods",
    BENCHMARK_MODE,
  ),
  "trainer.eval_every": Overwritten(
    "the benchmark evaluates each N-step run --config.benchmark.eval_points times and the "
    "other budgets at their end: leave out --config.trainer.eval_every and set --config.benchmark.eval_points",
    PER_PRESET,
  ),
  "trainer.log_every": Overwritten(
    "the benchmark logs each run at its evals (--config.benchmark.eval_points): leave out --config.trainer.log_every",
    PER_PRESET,
  ),
  "trainer.averaging_beta": Overwritten(
    "the benchmark tunes the averaging beta on the tuning seeds over "
    "--config.benchmark.betas: leave out --config.trainer.averaging_beta and set --config.benchmark.betas",
    schema.by_name(config_lib.TRAINER_FIELDS)["averaging_beta"].default,
  ),
}


def unknown_benchmark_fields(config: Config, known: set[str]) -> list[str]:
  """A line for each key of the benchmark block that is no field of it (`known`: `study.known_fields`), naming the
  nearest: ml_collections adds a key set from Python to an unlocked config (`c.benchmark.method = ...`)
  and the study would run on the field's default, without a word. The arms (`benchmark.arms`, checked by
  `arms.check`) are an open block; `benchmark.ladder.muon`'s keys are optimizer fields. The experiment
  blocks' keys are `config.unknown_field_errors`' (`validate_benchmark` calls it)."""
  optim = set(config.get("optim", {}))
  errors = []
  for name in config_lib.flatten(config.benchmark):
    top = name.split(".")[0]
    if name in known or top == "arms" or top in MOVED or top in OLD_FLAGS and "." not in name:
      continue  # an old name: `specs.moved_errors` names its field now
    muon = name.removeprefix("ladder.muon.")  # an optimizer field, where it is one of the ladder's Muon
    if muon != name and muon in optim:
      continue
    nearest = difflib.get_close_matches(muon, sorted(optim if muon != name else known), n=1, cutoff=0.6)
    hint = (
      f"did you mean --config.benchmark.{name.removesuffix(muon)}{nearest[0]}? "
      if nearest
      else "(docs/benchmark.md lists the fields) "
    )
    errors.append(
      f"--config.benchmark.{name} is not a field of the benchmark block: {hint}A misspelt key would leave the "
      "field it meant at its default; rename or remove it"
    )
  return errors


def moved_errors(fields: Mapping[str, Any]) -> list[str]:
  """The errors of setting the benchmark block's `fields` ({name: value}) by their names before the study blocks."""
  errors = []
  for field, value in fields.items():
    if field in MOVED:
      errors.append(f"--config.benchmark.{field} is now --config.benchmark.{MOVED[field]}: set that field instead")
    elif field in OLD_FLAGS and not isinstance(value, (dict, Config)):
      errors.append(
        f"--config.benchmark.{field}={value!r} is gone (benchmark.{field} is the {field} study's block now): "
        f"pick the study with --config.benchmark.study={field}"
      )
  return errors


class OpenBlock(Config):
  """A block that stays open when its config is locked (`benchmark.arms`): an arm of the user's is
  added by name, from Python too (`c.benchmark.arms.mine = {'method': ...}`); each arm's own fields
  are checked when the study starts (`arms.check`)."""

  def lock(self) -> OpenBlock:
    return self


class CheckedBlock(Config):
  """A block whose declared fields (`declare`) are checked as they are set, from Python too, by their
  declarations' checks (`schema.errors`), as a study's start checks the command line's values: each study's
  block (`study.add_defaults`) and the benchmark block (`BenchmarkBlock`)."""

  _declared: tuple[dict[str, schema.Field], str] = ({}, "")

  def declare(self, fields: Sequence[schema.Field], prefix: str) -> CheckedBlock:
    """This block, its `fields` checked from now on, named `--config.<prefix>.<name>` in the errors."""
    object.__setattr__(self, "_declared", (schema.by_name(fields), prefix))
    return self

  def __setitem__(self, key: str, value: Any) -> None:
    declared, prefix = self._declared
    if key in declared and (wrong := declared[key].check(value)):
      raise ValueError(f"--config.{prefix}.{key} {wrong}")
    super().__setitem__(key, value)

  def __getstate__(self) -> Record:  # the checks are closures: a copy (pickled, deep) is checked no more
    return {k: v for k, v in vars(self).items() if k != "_declared"}


class BenchmarkBlock(CheckedBlock):
  """The benchmark block (`config.benchmark`): its fields (`BENCHMARK_FIELDS`) are checked as they are set;
  setting a study's field by its old name fails, naming its field now (else a flat field would be added unread
  and the study would run on its default)."""

  _declared = (schema.by_name(BENCHMARK_FIELDS), "benchmark")

  def __setitem__(self, key: str, value: Any) -> None:
    refuse(moved_errors({key: value}))
    if key == "arms" and value is not None and not isinstance(value, OpenBlock):
      value = OpenBlock(value)  # the arms stay an open block, whatever form they are given in
    super().__setitem__(key, value)

  def update(self, *other: Any, **kwargs: Any) -> None:
    refuse(moved_errors(dict(*other, **kwargs)))
    super().update(*other, **kwargs)


# The experiment part of a benchmark config (without the `benchmark` block, in baseline mode: each run sets its
# own), with the task's own optimizer: its name is part of what every run is.
experiment_config = arms_lib.base_config


def family_name(config: Config) -> str:
  """The family the runs train: `benchmark.family`, or, for a task that brings its own optimizer
  (its `OPTIMIZER`), that optimizer's name with the schedule, since no built-in one runs."""
  optimizer = tasks_lib.optimizer_name(task_name(config))
  return str(config.benchmark.family) if optimizer is None else f"{optimizer}-{config.optim.schedule}"


def compile_cache_dir(config: Config, workdir: str) -> str | None:
  """JAX's persistent compilation cache of a benchmark: `<workdir>/jax_cache` unless set."""
  if config.trainer.compile_cache:
    return config.trainer.compile_cache_dir or os.path.join(os.path.abspath(workdir), "jax_cache")
  return None


def task_name(config: Config) -> str:
  """The benchmark's task (`benchmark.task`, 'gpt2' when the config predates the field)."""
  return str(config.benchmark.get("task", "gpt2"))


def repeated_seed_errors(name: str, seeds: tuple[int, ...]) -> list[str]:
  """The error of a seed list (`benchmark.<name>`) that names a seed twice, or none.

  A repeated seed trains the same run again (or reads it from the run cache): the figures would
  count one measurement as two, and the spread over the seeds would shrink with no new evidence.
  """
  repeated = sorted({s for s in seeds if seeds.count(s) > 1})
  if not repeated:
    return []
  distinct = list(dict.fromkeys(seeds))
  while len(distinct) < len(seeds):  # as many seeds as given, the repeats replaced by new ones
    distinct.append(max(distinct) + 1)
  return [
    f"--config.benchmark.{name}={seeds} repeats seed(s) {repeated}: a seed fixes the init and the data order, so "
    "a repeated seed is the same run counted twice, and the spread over the seeds would shrink with no new "
    f"measurement; give distinct seeds (e.g. --config.benchmark.{name}={tuple(distinct)})"
  ]


def block_errors(b: Config, names: tuple[str, ...] = ()) -> list[str]:
  """A line for each field of the benchmark block `b` (of `names`, default every declared one) whose
  declared check refuses its value."""
  return schema.errors("benchmark", [f for f in BENCHMARK_FIELDS if f.name in b and (not names or f.name in names)], b)


def _protocol_errors(b: Config) -> list[str]:
  """The benchmark block's fields (`BENCHMARK_FIELDS`' checks), then the relations among the protocol's:
  the seeds, the budgets, the betas, the plateau rule (a relation is checked where its fields pass)."""
  errors = block_errors(b)
  bad = {e.split()[0].removeprefix("--config.benchmark.") for e in errors}
  seeds = ("seeds", "tuning_seeds", "plateau_seeds")
  if not set(seeds) & bad:
    if len(b.tuning_seeds) != 2:
      errors.append(f"benchmark.tuning_seeds must hold 2 seeds, got {tuple(b.tuning_seeds)}")
    if len(b.seeds) < 2:
      errors.append(f"benchmark.seeds needs at least 2 headline seeds (3 or more for a headline), got {tuple(b.seeds)}")
    for name in seeds:
      errors += repeated_seed_errors(name, tuple(b[name]))
    if set(b.seeds) & set(b.tuning_seeds):
      errors.append("benchmark.seeds and benchmark.tuning_seeds must not share a seed: headline seeds never tune")
    if set(b.plateau_seeds) & (set(b.seeds) | set(b.tuning_seeds)):
      errors.append("benchmark.plateau_seeds must not repeat a headline or tuning seed")
  if "budgets" not in bad and (1.0 not in tuple(b.budgets) or len(set(b.budgets)) != len(b.budgets)):
    errors.append(f"benchmark.budgets must be distinct positive factors of N including 1.0, got {tuple(b.budgets)}")
  if "betas" not in bad and any(not x < 1 for x in b.betas):
    errors.append(f"benchmark.betas must be averaging betas in (0, 1), got {tuple(b.betas)}")
  return errors


def validate_benchmark(config: Config) -> None:
  """Checks the benchmark block; errors name the field and the fix."""
  b, task = config.benchmark, task_name(config)
  errors = _protocol_errors(b)
  if config.trainer.averaging != "ema":
    errors.append("the benchmark compares averaged anchors: keep --config.trainer.averaging=ema")
  if config.get("hybrid", {}).get("method", ""):
    errors.append(method_field_error(config.hybrid.method))
  if int(config.optim.get("decay_steps", 0)):
    # `run_spec` sets each budget's trainer.steps; a fixed decay length would give every budget the
    # same schedule, cut off or left at its floor, and bend the anchors' budget curve.
    errors.append(
      f"--config.optim.decay_steps={config.optim.decay_steps}: the benchmark gives each budget its own "
      "schedule, decaying over that budget's steps; a fixed decay length would end a short budget's "
      "schedule early and hold a long one at its floor. Leave --config.optim.decay_steps at 0"
    )
  try:
    optimizer = tasks_lib.optimizer_name(task)
  except ValueError as e:
    errors.append(str(e))
  else:
    if optimizer in optim_lib.BUILTIN_OPTIMIZERS:
      errors.append(
        f"the task {task!r} names its own optimizer OPTIMIZER={optimizer!r}, a built-in optimizer's name: "
        "give it a name of its own (e.g. 'my_adamw'), so that its runs never share a cache entry with the built-in's"
      )
  errors += mlp_block_errors(config)
  if task == "gpt2":
    errors += gpt2_task.gpt2_task_errors(config)
  errors += moved_errors(b)  # a block copied without its guard
  refuse(errors + arms_lib.check(config))
  arms_lib.selected(config)
  preflight.validate(experiment_config(config))


# The mlp task's block, `config.mlp` (`tasks.mlp.default_task_config`, whose values are the defaults): each
# field's check and doc. The benchmark checks it where the task is 'mlp'; the command line sets its fields
# once `--config.benchmark.task=mlp` names the task (experiments/configs/benchmark.py, `before_command_line`).
MLP_FIELDS = tuple(  # each an integer >= 1, `features` a tuple of them
  schema.Field(
    name,
    mlp_task.default_task_config()[name],
    schema.check_int_tuple(1) if name == "features" else schema.check_int(1),
    doc,
  )
  for name, doc in {
    "features": "the MLP's hidden layers, their widths, e.g. (64, 64)",
    "n_in": "the input's width",
    "n_out": "the output's width (the teacher's too)",
    "examples": "the synthetic training examples the batches are drawn from",
    "eval_examples": "the held-out examples (at least trainer.eval_batches x batch_size)",
  }.items()
)


def mlp_block_errors(config: Config) -> list[str]:
  """The `mlp` task's block checked where the task is 'mlp' (`MLP_FIELDS`): a key it does not read (a
  misspelling would train the default silently), one it lacks (the task would fail after the workdir is made)
  or a value its check refuses; and held-out examples for `trainer.eval_batches` (the task refuses fewer when
  it is built, in the runs)."""
  if task_name(config) != "mlp":
    return []
  m, declared = config.get("mlp") or mlp_task.default_task_config(), sorted(f.name for f in MLP_FIELDS)
  errors = [
    f"--config.mlp.{key} is not a field of the mlp task's block (it reads {declared})"
    for key in sorted(set(m) - set(declared))
  ]
  if missing := [f for f in declared if f not in m]:
    errors.append(
      f"the mlp block lacks {missing}: start from hybridjax.tasks.mlp.default_task_config() and change its fields"
    )
  errors += schema.errors("mlp", [f for f in MLP_FIELDS if f.name in m], m)
  t = config.trainer
  if not errors and t.eval_batches * t.batch_size > m.eval_examples:
    errors.append(
      f"--config.trainer.eval_batches={t.eval_batches} batches of trainer.batch_size={t.batch_size} need "
      f"{t.eval_batches * t.batch_size} held-out examples, but --config.mlp.eval_examples={m.eval_examples}: lower "
      "--config.trainer.eval_batches, or raise --config.mlp.eval_examples"
    )
  return errors


def task_seeds_record(config: Config) -> str:
  """What the record says of the task's data across seeds (`check_task_seeds` ran before training)."""
  name = task_name(config)
  if tasks_lib.seed_independent(name):
    return (
      f"not checked: task {name!r} declares SEED_INDEPENDENT_DATA (its batches do not depend on config.seed, so "
      "every seed trains on the same data and a '± se' measures the initialisation only)"
    )
  if name in tasks_lib.BUILTIN_TASKS:
    return "a built-in task: its batches are drawn from config.seed"
  return "checked: the task's first batch differs between two seeds"


def seeds_of_check(config: Config) -> list[int]:
  """The two seeds `first_batches_differ` builds the task with: the first two of `benchmark.seeds`
  and `tuning_seeds`."""
  seeds = list(dict.fromkeys([*config.benchmark.seeds, *config.benchmark.tuning_seeds]))[:2]
  return seeds if len(seeds) == 2 else ([seeds[0], seeds[0] + 1] if seeds else [0, 1])


def first_batches_differ(config: Config) -> bool:
  """Whether the task's first batch (`train_batch(0)`) differs between the two seeds of `seeds_of_check`:
  the task built twice, no step computed."""
  import numpy as np

  batches = []
  for seed in seeds_of_check(config):
    c = experiment_config(config)
    c.seed = int(seed)
    batches.append(jax.tree.leaves(tasks_lib.build(task_name(config), c)["train_batch"](0)))
  a, b = batches
  return not (len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)))  # of one shape, equal


def check_task_seeds(config: Config) -> None:
  """Refuses a task of the user's whose first batch is the same under two seeds (`first_batches_differ`):
  it ignores `config.seed`, so every headline seed would see the same data. A task that means it
  declares `SEED_INDEPENDENT_DATA = True` in its module, and the record says so (`task_seeds_record`).
  The built-in tasks draw their batches from the seed (the test suite checks it), so they are not
  built twice at every invocation."""
  name = task_name(config)
  if tasks_lib.seed_independent(name) or name in tasks_lib.BUILTIN_TASKS or first_batches_differ(config):
    return
  a, b = seeds_of_check(config)
  raise ValueError(
    f"--config.benchmark.task={name!r}: its first batch, train_batch(0), is the same under --config.seed="
    f"{a} and {b}: the task ignores config.seed, so every seed of the benchmark would train on the "
    "same data and each '± se' would measure the initialisation only. Draw the batches from config.seed in "
    "build_task; or, if the task means it, declare SEED_INDEPENDENT_DATA = True in its module (the record "
    "says so). Nothing was trained"
  )


def check_user_task(config: Config) -> None:
  """Refuses a task of the user's (not a built-in one) whose batches are not the ones the config
  states (`loop.train.check_batch_counts`: the record states `trainer.batch_size` and
  `trainer.eval_batches`), or whose own optimizer (its `tx`) the config's schedule cannot drive
  (`user_optimizer.check_user_optimizer`), before any run trains: the anchors train the task without
  `train()`, which checks both. It builds the task once (as each of its runs does) and traces its
  optimizer on the params' shapes, computing nothing."""
  from hybridjax.loop import train as train_lib

  name = task_name(config)
  if name in tasks_lib.BUILTIN_TASKS:
    return
  c = experiment_config(config)
  task = tasks_lib.build(name, c)
  try:
    train_lib.check_batch_counts(c.trainer, task["train_batch"](0), task.get("eval_batches", []))
  except ValueError as e:
    raise ValueError(f"--config.benchmark.task={name!r} (its build_task): {e}") from None
  if tasks_lib.optimizer_name(name) is None or task.get("tx") is None:
    return  # no optimizer of its own, or named but not given (`optim.resolve_optimizer` refuses that)
  params = jax.eval_shape(task["init_params"], jax.random.PRNGKey(0))
  try:
    tx = optim_lib.resolve_optimizer(c.optim, params, task["tx"])
    user_optimizer.check_user_optimizer(tx, params, c.optim)
  except ValueError as e:
    raise ValueError(f"--config.benchmark.task={name!r} gives its own optimizer (tx), refused: {e}") from None


def method_field_error(method: str) -> str:
  """The error of a benchmark config that names a method in `hybrid.method`: each run's method is its
  arm's, so that field would be overwritten (and in the experiment config, in baseline mode, refused)."""
  return (
    f"--config.hybrid.method={method!r}: the benchmark runs a method as an arm, each run in its arm's mode "
    f"with its arm's method, so it reads no --config.hybrid.method (nor --config.mode): leave them out and name "
    f"the method in --config.benchmark.methods (e.g. --config.benchmark.methods={method}: its arm and its control "
    f"arm), or define an arm with --config.benchmark.arms.<name>.method={method} and name <name> there"
  )


def budget_warmup_steps(config: Config, steps: int) -> int:
  """Muon's momentum warm-up (`optim.muon_momentum_warmup_steps`) of a run of `steps` steps in a
  family whose N-step runs (N = `trainer.steps`) warm it up over W steps: each budget its own
  schedule, so its warm-up is the same share of its run (W/N of it, at least one step); W as the
  recipe's `shortcuts` trick sets it (`speedrun.MOMENTUM_WARMUP_FRACTION` of the run) gives exactly
  what the trick gives a run of `steps` steps. 0 (no warm-up) stays 0; N keeps W."""
  n, warmup = int(config.trainer.steps), int(config.optim.get("muon_momentum_warmup_steps", 0))
  if warmup == 0 or int(steps) == n:
    return warmup
  if warmup == max(1, round(speedrun.MOMENTUM_WARMUP_FRACTION * n)):
    return max(1, round(speedrun.MOMENTUM_WARMUP_FRACTION * int(steps)))
  return max(1, round(warmup * int(steps) / n))


def run_spec(
  config: Config,
  *,
  kind: str,
  seed: int,
  lr: float,
  steps: int,
  beta: float,
  betas: Sequence[float] = (),
  method: str = "",
  wide_eval: int = 0,
) -> Record:
  """One run, as plain data: what it trains (the whole experiment config, the task) and what it
  records. `method` names an arm of `benchmark.arms` for a method run. `wide_eval` > 0: an anchor that
  ends with an eval on that many times `trainer.eval_batches` (`runs.wide_eval_run`); the field is in
  the spec only then, so every other spec, and its key, is as before.

  Runs of N steps (anchors and methods) are evaluated `benchmark.eval_points` times, for the eval
  curves and the mid-run check; other budgets only at their end.
  """
  if wide_eval and kind != "anchor":
    raise ValueError(f"a wide eval ends an anchor run; a {kind!r} run has none")
  c = experiment_config(config)
  c.seed, c.optim.learning_rate = int(seed), float(lr)
  if "muon_momentum_warmup_steps" in c.optim:  # each budget its own schedule: its warm-up too
    c.optim.muon_momentum_warmup_steps = budget_warmup_steps(config, steps)
  points = int(config.benchmark.eval_points) if int(steps) == int(config.trainer.steps) else 1
  every = max(int(steps) // points, 1)
  c.trainer.update(steps=int(steps), averaging_beta=float(beta), eval_every=every, log_every=every)
  for field in ("compile_cache", "compile_cache_dir", "progress"):  # how, not what: not in the key
    del c.trainer[field]
  if kind == "method":
    arms_lib.apply(arms_lib.arms(config)[method], c)
  else:  # in baseline mode (`experiment_config`)
    del c.hybrid  # an anchor trains no hybrid part: its settings are not part of what it is
  return {
    "kind": kind,
    "method": method,
    "task": task_name(config),
    "config": c.to_dict(),
    "betas": [float(x) for x in betas],
  } | ({"wide_eval": int(wide_eval)} if wide_eval else {})


_DEPRECATED = "{} is deprecated and goes in the next release: {}"  # an old name on the command line


def current_names(argv: list[str]) -> list[str]:
  """`argv` with the study flags and fields of the release before the study blocks in today's names,
  each with a FutureWarning naming the field now: `--config.benchmark.ladder=True` is
  `--config.benchmark.study=ladder` (`=False`: left out), `--config.benchmark.ladder_rungs=R6` is
  `--config.benchmark.ladder.rungs=R6` (`MOVED`)."""
  out, named = [], {}  # named: each argument that names a study -> the study
  for arg in argv:
    m = re.fullmatch(r"(--(?:no)?config\.benchmark\.)(\w+)(.*)", arg)
    new = arg
    if m and m[2] in MOVED:
      new = m[1] + MOVED[m[2]] + m[3]
      warnings.warn(_DEPRECATED.format(arg.split("=")[0], f"use {new.split('=')[0]}"), FutureWarning, stacklevel=2)
    elif m and m[2] in OLD_FLAGS and m[3][:1] in ("", "="):
      on = m[1] == "--config.benchmark." and m[3].lower() in ("", "=true", "=1")
      new = f"--config.benchmark.study={m[2]}" if on else ""
      warnings.warn(_DEPRECATED.format(arg, f"use {new}" if on else "leave it out"), FutureWarning, stacklevel=2)
    if new.startswith("--config.benchmark.study="):
      named[arg] = new.split("=", 1)[1]
    out += [new] if new else []
  if len(set(named.values())) > 1 and any(not a.startswith("--config.benchmark.study=") for a in named):
    sys.exit(f"error: {' and '.join(named)} name different studies: set --config.benchmark.study alone")
  return out
