"""The runner: each spec trained once, in worker processes (one CPU core and one XLA thread each) or
in this one, its result cached on disk under its key.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import time
from typing import Any

from hybridjax.bench.keys import run_key
from hybridjax.bench.runs import enable_cache, execute, init_worker


class Runner:
  """Runs specs once: cached results by key, the rest in `workers` processes (or in this one)."""

  def __init__(self, workdir: str, workers: int, compile_cache_dir: str | None):
    self.cache_dir = os.path.join(workdir, "cache")
    self.jax_cache = compile_cache_dir
    os.makedirs(self.cache_dir, exist_ok=True)
    self.workers = workers
    self._trained: set[str] = set()  # runs trained by this benchmark
    self._reused: set[str] = set()  # runs found in the cache from an earlier benchmark
    self._pool: concurrent.futures.ProcessPoolExecutor | None = None

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
    """Stops the worker processes (they live across `run` calls: each compiles its programs once);
    `cancel`: drop the runs still queued (after a failure)."""
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=cancel)
      self._pool = None

  def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
    if self._pool is None:
      ctx = multiprocessing.get_context("spawn")
      counter = ctx.Value("i", 0)
      cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
      self._pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=self.workers, mp_context=ctx, initializer=init_worker, initargs=(counter, cores, self.jax_cache)
      )
    return self._pool

  def _path(self, key: str) -> str:
    return os.path.join(self.cache_dir, key + ".json")

  def run(self, specs: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    keys = [run_key(s) for s in specs]
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for key, spec in zip(keys, specs):
      if key in results:
        continue
      if os.path.exists(self._path(key)):
        with open(self._path(key)) as f:
          results[key] = json.load(f)
        if key not in self._trained:
          self._reused.add(key)
      else:
        todo.append((key, spec))
        results[key] = None
    print(f"--- {label}: {len(specs)} runs, {len(todo)} to train, {len(specs) - len(todo)} cached", flush=True)
    t0 = time.perf_counter()

    def finish(key: str, result: dict[str, Any]) -> None:
      result["key"] = key
      with open(self._path(key) + ".tmp", "w") as f:
        json.dump(result, f)
      os.replace(self._path(key) + ".tmp", self._path(key))
      results[key] = result
      self._trained.add(key)
      what = f"{result['kind']} {result.get('method') or ''} seed {result['seed']} lr {result['lr']:.3g} "
      print(f"    done {what}steps {result['steps']} ({time.perf_counter() - t0:.0f} s)", flush=True)

    if self.workers <= 1:
      enable_cache(self.jax_cache)
      for key, spec in todo:
        finish(key, execute(spec, os.path.join(self.cache_dir, "runs", key), self.jax_cache))
    elif todo:
      pool = self._get_pool()
      # Longest first (method runs first among equals: they compile more), so the last runs to
      # finish are short ones and no worker waits long for the other.
      order = sorted(todo, key=lambda kv: (-kv[1]["config"]["trainer"]["steps"], kv[1]["kind"] != "method"))
      futures = {
        pool.submit(execute, spec, os.path.join(self.cache_dir, "runs", key), self.jax_cache): key
        for key, spec in order
      }
      for fut in concurrent.futures.as_completed(futures):
        finish(futures[fut], fut.result())
    return [results[k] for k in keys]
