"""Run specs as plain data (what a run trains and records), their cache keys, and the checks on the
benchmark block.

A run's cache key hashes its spec (the whole experiment config, the task, the arm) and the code the
run executes, found from the source rather than listed by hand: the modules its runner imports
(`RUNNER_MODULES`: the anchor's and the method arm's entry points), its task's module and, for a
method arm, its method's module (both loaded by name, so no `import` statement reaches them), and
everything of the package or of the user's code those import, transitively, read from their
`import` statements with `ast` (imports inside functions included; nothing is imported to find
them). Of the libraries below the code, the versions enter the key, not the files: those of
`LIBRARIES` and of every other installed distribution the code imports directly.

Why this and not the alternatives: hashing every .py file retrains every run at a report edit; a
fixed list of files per run kind goes stale at the first new module; the modules loaded in a
process (`sys.modules`) are known only after the run, and the benchmark's own process has the
report, the figures and the plots loaded too. The closure from the runners' imports holds exactly
what a worker runs, and nothing that only reads results: editing the report, a figure, a plot or
the tuning logic keeps every cached run; an anchor imports neither the hybrid algorithm nor a
method, so editing those keeps the cached anchors; editing one method keeps the other methods'
runs. What the closure cannot see: code reached only through a name in a config (a method composed
by name, a module given as a string); a run of this library reaches the method and the task that
way, and both are added above.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax import registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import tasks as tasks_lib

# The module each kind of run executes (`hybridjax.bench.runs`' two entry points import no more).
RUNNER_MODULES = {"anchor": "hybridjax.bench.anchor_run", "method": "hybridjax.bench.method_run"}
# The distributions below the code whose versions enter every key (their files are not hashed),
# besides those the code imports directly: jaxlib, XLA's, is imported by jax alone.
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections")


def experiment_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The experiment part of a benchmark config (without the `benchmark` block)."""
  optimizer = tasks_lib.optimizer_name(task_name(config))
  c = ml_collections.ConfigDict(config.to_dict())
  del c.benchmark
  c.mode = "baseline"  # each run sets its own
  if optimizer is not None:  # the task's own optimizer: its name is part of what every run is
    c.optim.name = optimizer
  return c


def task_name(config: ml_collections.ConfigDict) -> str:
  """The benchmark's task (`benchmark.task`, 'gpt2' when the config predates the field)."""
  return str(config.benchmark.get("task", "gpt2"))


def validate_benchmark(config: ml_collections.ConfigDict) -> None:
  """Checks the benchmark block; errors name the field and the fix."""
  b = config.benchmark
  errors = []
  if len(b.tuning_seeds) != 2:
    errors.append(f"benchmark.tuning_seeds must hold 2 seeds, got {tuple(b.tuning_seeds)}")
  if len(b.seeds) < 2:
    errors.append(f"benchmark.seeds needs at least 2 headline seeds (3 or more for a headline), got {tuple(b.seeds)}")
  if set(b.seeds) & set(b.tuning_seeds):
    errors.append("benchmark.seeds and benchmark.tuning_seeds must not share a seed: headline seeds never tune")
  if 1.0 not in tuple(b.budgets) or any(f <= 0 for f in b.budgets) or len(set(b.budgets)) != len(b.budgets):
    errors.append(f"benchmark.budgets must be distinct positive factors of N including 1.0, got {tuple(b.budgets)}")
  if int(b.lr_points) < 3:
    errors.append(f"benchmark.lr_points must be >= 3, got {b.lr_points}")
  if not b.betas or any(not 0 < x < 1 for x in b.betas):
    errors.append(f"benchmark.betas must be averaging betas in (0, 1), got {tuple(b.betas)}")
  if int(b.workers) < 1:
    errors.append(f"benchmark.workers must be >= 1, got {b.workers}")
  if int(b.eval_points) < 1 or int(b.timing_rounds) < 1 or int(b.timing_steps) < 1:
    errors.append("benchmark.eval_points, timing_rounds and timing_steps must be >= 1")
  if config.trainer.averaging != "ema":
    errors.append("the benchmark compares averaged anchors: keep --config.trainer.averaging=ema")
  try:
    optimizer = tasks_lib.optimizer_name(task_name(config))
  except ValueError as e:
    errors.append(str(e))
  else:
    if optimizer in optim_lib.BUILTIN_OPTIMIZERS:
      errors.append(
        f"the task {task_name(config)!r} names its own optimizer OPTIMIZER={optimizer!r}, a built-in optimizer's name: "
        "give it a name of its own (e.g. 'my_adamw'), so that its runs never share a cache entry with the built-in's"
      )
  errors += arms_lib.check(config)
  if errors:
    raise ValueError("; ".join(errors))
  arms_lib.selected(config)
  config_lib.validate(experiment_config(config))


def _module_file(name: str) -> str | None:
  """The source file of module `name`, or None when it is not a plain source file."""
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):
    return None
  origin = getattr(spec, "origin", None)
  return origin if origin and origin.endswith(".py") else None


def _is_library(name: str, path: str) -> bool:
  """A module of the standard library or of an installed distribution (versioned, not hashed). The
  package itself is always hashed, even when installed."""
  if name.split(".")[0] == "hybridjax":
    return False
  roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
  return any(os.path.abspath(path).startswith(os.path.abspath(r) + os.sep) for r in roots)


def _imports(path: str, module: str) -> set[str]:
  """Every module `path` (module `module`) imports, at any depth, as absolute names."""
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
      found.add(base)
      found.update(f"{base}.{a.name}" for a in node.names)
  return found


def _closure(module: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(the source files of `module` and of every non-library module it imports, transitively; the
  top-level names of the installed, non-standard modules those import directly)."""
  return _closure_on_path(module, tuple(sys.path))  # where a name's file is depends on sys.path


@functools.cache
def _closure_on_path(module: str, path: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
  del path  # the cache's key
  seen: dict[str, str] = {}
  libraries: set[str] = set()
  todo = [module]
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    path = _module_file(name)
    if path is None or _is_library(name, path):
      seen[name] = ""
      top = name.split(".")[0]
      if path is not None and top not in sys.stdlib_module_names:
        libraries.add(top)
      continue
    seen[name] = path
    # A package's __init__ runs before any of its modules.
    parent = name.rpartition(".")[0]
    todo += [parent] if parent else []
    todo += sorted(_imports(path, name))
  return tuple(sorted({p for p in seen.values() if p})), tuple(sorted(libraries))


def source_closure(module: str) -> tuple[str, ...]:
  """The source files of `module` and of every non-library module it imports, transitively."""
  return _closure(module)[0]


def _distributions(modules: Sequence[str]) -> list[str]:
  """The installed distributions whose versions enter the key: `LIBRARIES`, and those providing
  the top-level modules the code of `modules` imports."""
  providers = metadata.packages_distributions()
  names = set(LIBRARIES)
  for m in modules:
    for top in _closure(m)[1]:
      names.update(providers.get(top, ()))
  return sorted(names, key=str.lower)


def code_version(modules: Sequence[str]) -> str:
  """A hash of the source of `modules` and everything they import, and of the libraries' versions."""
  h = hashlib.sha256()
  files = sorted({p for m in modules for p in source_closure(m)})
  for path in files:
    h.update(os.path.basename(path).encode())
    with open(path, "rb") as f:
      h.update(f.read())
  for lib in _distributions(modules):
    try:
      h.update(f"{lib} {metadata.version(lib)}".encode())
    except metadata.PackageNotFoundError:
      h.update(f"{lib} absent".encode())
  return h.hexdigest()[:16]


def spec_modules(spec: dict[str, Any]) -> list[str]:
  """The modules a spec's run executes: its runner's, its task's, and its method's."""
  modules = [RUNNER_MODULES[spec["kind"]], tasks_lib.task_path(spec["task"])]
  method = spec["config"].get("hybrid", {}).get("method")
  if spec["kind"] == "method" and method:
    modules.append(registry.method_path(method))
  return modules


def run_key(spec: dict[str, Any]) -> str:
  """The cache key of a run: its spec and the code it executes."""
  version = code_version(spec_modules(spec))
  return hashlib.sha256((json.dumps(spec, sort_keys=True) + version).encode()).hexdigest()[:20]


def code_versions(config: ml_collections.ConfigDict, methods: Sequence[str]) -> dict[str, str]:
  """The code version of the anchors' runs and of each arm's in `methods`: the hashes the run cache
  keys on, recorded in benchmark.json."""
  task = tasks_lib.task_path(task_name(config))
  defined = arms_lib.arms(config)
  out = {"anchor": code_version([RUNNER_MODULES["anchor"], task])}
  for m in methods:
    out[m] = code_version([RUNNER_MODULES["method"], task, registry.method_path(defined[m].method)])
  return out


def run_spec(
  config: ml_collections.ConfigDict,
  *,
  kind: str,
  seed: int,
  lr: float,
  steps: int,
  beta: float,
  betas: Sequence[float] = (),
  method: str = "",
) -> dict[str, Any]:
  """One run, as plain data: what it trains (the whole experiment config, the task) and what it
  records. `method` names an arm of `benchmark.arms` for a method run.

  Runs of N steps (anchors and methods) are evaluated `benchmark.eval_points` times, for the eval
  curves and the mid-run check; other budgets only at their end.
  """
  c = experiment_config(config)
  c.seed = int(seed)
  c.optim.learning_rate = float(lr)
  c.trainer.steps = int(steps)
  c.trainer.averaging_beta = float(beta)
  points = int(config.benchmark.eval_points) if int(steps) == int(config.trainer.steps) else 1
  c.trainer.eval_every = max(int(steps) // points, 1)
  c.trainer.log_every = c.trainer.eval_every
  for field in ("compile_cache", "compile_cache_dir", "progress"):  # how, not what: not in the key
    del c.trainer[field]
  if kind == "method":
    arms_lib.apply(arms_lib.arms(config)[method], c)
  else:
    c.mode = "baseline"
    del c.hybrid  # an anchor trains no hybrid part: its settings are not part of what it is
  return {
    "kind": kind,
    "method": method,
    "task": task_name(config),
    "config": c.to_dict(),
    "betas": [float(x) for x in betas],
  }
