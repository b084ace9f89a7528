"""The runner: each spec trained once, its result cached on disk under its key, by an executor.

Two executors train the runs a cache does not hold (`benchmark.executor`):

* `local` (the default): worker processes on this machine, one CPU core and one XLA thread each
  (`benchmark.workers`), or this process when `workers` is 1;
* `ray`: each run a Ray task on a Ray cluster (`hybridjax.bench.runs.cluster`, the `[cluster]` extra).

Either way only this process, the driver, reads and writes the run cache, so a run cached by one
executor is reused by the other; both run `runs.execute` in a process set up by `runs.init_worker`'s
rules, so they compute the same bits.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from hybridjax import registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import specs as specs_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.runs.executors import Executor, LocalExecutor, Todo, describe
from hybridjax.bench.runs.keys import RUNNER_MODULES, run_key
from hybridjax.bench.studies import Config, Record


class Progress:
  """Runs done out of total and an ETA, from the steps trained so far (runs differ in length)."""

  def __init__(self, todo: Todo):
    self.total = len(todo)
    self.steps = sum(int(s["config"]["trainer"]["steps"]) for _, s in todo)
    self.done = self.steps_done = 0
    self.t0 = time.perf_counter()

  def line(self, result: Record) -> str:
    self.done += 1
    self.steps_done += int(result["steps"])
    elapsed = time.perf_counter() - self.t0
    eta = elapsed / self.steps_done * max(self.steps - self.steps_done, 0) if self.steps_done else 0.0
    return f"    done {describe(result)} ({elapsed:.0f} s) [{self.done}/{self.total}, ETA {_duration(eta)}]"


def _duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  if seconds < 90 * 60:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"


class Runner:
  """Runs specs once: cached results by key, the rest by `executor`."""

  def __init__(self, workdir: str, executor: Executor):
    self.cache_dir = os.path.join(workdir, "cache")
    os.makedirs(self.cache_dir, exist_ok=True)
    self.executor = executor
    self._trained: set[str] = set()  # runs trained by this benchmark
    self._reused: set[str] = set()  # runs found in the cache from an earlier benchmark

  @property
  def ran(self) -> int:
    return len(self._trained)

  @property
  def reused(self) -> int:
    return len(self._reused)

  def __enter__(self) -> Runner:
    return self

  def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
    """Stops the workers; after a failure (or Ctrl-C) the runs still queued are dropped."""
    self.close(cancel=exc_type is not None)

  def close(self, cancel: bool = False) -> None:
    """Stops the executor's workers; `cancel`: drop the runs still queued (after a failure)."""
    self.executor.close(cancel=cancel)

  def _path(self, key: str) -> str:
    return os.path.join(self.cache_dir, key + ".json")

  def run(self, specs: list[Record], label: str) -> list[Record]:
    keys = [run_key(s) for s in specs]
    results: dict[str, Record] = {}
    todo = []
    for key, spec in zip(keys, specs):
      if key in results:
        continue
      if os.path.exists(path := self._path(key)):
        with open(path) as f:
          results[key] = json.load(f)
        if key not in self._trained:
          self._reused.add(key)
      else:
        todo.append((key, spec))
        results[key] = None
    print(f"--- {label}: {len(specs)} runs, {len(todo)} to train, {len(specs) - len(todo)} cached", flush=True)
    progress = Progress(todo)
    for key, result in self.executor.map(todo, lambda key: os.path.join(self.cache_dir, "runs", key)):
      result["key"] = key
      path = self._path(key)
      with open(path + ".tmp", "w") as f:
        json.dump(result, f)
      os.replace(path + ".tmp", path)
      results[key] = result
      self._trained.add(key)
      print(progress.line(result), flush=True)
    return [results[k] for k in keys]


def protocol_modules(config: Config) -> list[str]:
  """Every module a benchmark of `config` may run: both runners', its task's, and the method of each
  arm it defines. The Ray executor ships their packages once, so one connection serves the whole
  protocol (Ray uploads code per connection)."""
  modules = [*RUNNER_MODULES.values(), tasks_lib.task_path(specs_lib.task_name(config))]
  modules += [registry.method_path(arm.method) for arm in arms_lib.arms(config).values() if arm.method]
  return sorted(set(modules))


def make_runner(config: Config, workdir: str) -> Runner:
  """The runner of a benchmark config: its executor (`benchmark.executor`), its workers or its Ray
  resources, and its compilation cache. A Ray cluster that cannot be reached is refused here, before
  any run is trained."""
  b = config.benchmark
  specs_lib.refuse(specs_lib.block_errors(b, ("executor", "cpus_per_run", "gpus_per_run")))
  jax_cache = specs_lib.compile_cache_dir(config, workdir)
  if b.executor == "ray":
    from hybridjax.bench.runs import cluster

    executor: Executor = cluster.RayExecutor(
      b.ray_address,
      cpus_per_run=float(b.cpus_per_run),
      gpus_per_run=float(b.gpus_per_run),
      compile_cache_dir=jax_cache,
      modules=protocol_modules(config),
    )
  else:
    executor = LocalExecutor(int(b.workers), jax_cache)
  return Runner(workdir, executor)
