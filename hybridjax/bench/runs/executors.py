"""Executors: what trains the runs a benchmark's cache does not hold (`benchmark.executor`).

An executor's `map` takes (key, spec) pairs and yields (key, result) as each run finishes; `close`
stops its workers. `LocalExecutor` is the default (worker processes on this machine);
`cluster.RayExecutor` runs each run as a Ray task. Neither touches the run cache: the runner, in
the driver, reads and writes it.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from hybridjax.bench.runs.worker import enable_cache, execute, init_worker
from hybridjax.bench.studies import Record

Todo = Sequence[tuple[str, Record]]  # (key, spec) of each run to train


class Executor(Protocol):
  """Trains runs: `map` yields (key, result) as each finishes; `close` stops its workers."""

  def map(self, todo: Todo, run_dir: Callable[[str], str]) -> Iterator[tuple[str, Record]]: ...

  def close(self, cancel: bool = False) -> None: ...


def longest_first(todo: Todo) -> list[tuple[str, Record]]:
  """Longest first (method runs first among equals: they compile more), so the last runs to finish
  are short ones and no worker waits long for another."""
  return sorted(todo, key=lambda kv: (-kv[1]["config"]["trainer"]["steps"], kv[1]["kind"] != "method"))


class LocalExecutor:
  """`workers` processes on this machine (one core, one XLA thread each), or this one (`workers` 1)."""

  def __init__(self, workers: int, compile_cache_dir: str | None):
    self.workers = int(workers)
    self.jax_cache = compile_cache_dir
    self._pool: concurrent.futures.ProcessPoolExecutor | None = None

  def map(self, todo: Todo, run_dir: Callable[[str], str]) -> Iterator[tuple[str, Record]]:
    if self.workers <= 1:
      enable_cache(self.jax_cache)
      for key, spec in todo:
        yield key, execute(spec, run_dir(key), self.jax_cache)
      return
    if not todo:
      return
    if self._pool is None:  # the processes live across `map` calls: each compiles its programs once
      ctx = multiprocessing.get_context("spawn")
      counter = ctx.Value("i", 0)
      cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
      self._pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=self.workers, mp_context=ctx, initializer=init_worker, initargs=(counter, cores, self.jax_cache)
      )
    futures = {self._pool.submit(execute, spec, run_dir(key), self.jax_cache): key for key, spec in longest_first(todo)}
    for fut in concurrent.futures.as_completed(futures):
      yield futures[fut], fut.result()

  def close(self, cancel: bool = False) -> None:
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=cancel)
      self._pool = None


def describe(result_or_spec: Record) -> str:
  """'anchor seed 1 lr 0.006 steps 3000': a run, for progress lines and errors."""
  r = result_or_spec
  if "config" in r:  # a spec
    c = r["config"]
    r = r | {"seed": c["seed"], "lr": c["optim"]["learning_rate"], "steps": c["trainer"]["steps"]}
  return f"{r['kind']} {r.get('method') or ''} seed {r['seed']} lr {r['lr']:.3g} steps {r['steps']}".replace("  ", " ")
