"""One run of a spec, in this process or a worker: the entry point of the runner's workers. An anchor
runs through the baseline loop (`anchor_run`), a method arm through `train()` (`method_run`).

It imports no jax at module level: a worker's process is set up (`worker_xla_flags`, one thread)
before jax first builds its backend, whichever executor started it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# XLA:CPU on one thread: small models are overhead-bound, so two single-thread processes get more
# steps per second from 2 cores than one two-thread process. Every executor's workers run with it,
# so their programs (and their bits) are the same.
SINGLE_THREAD_FLAG = "--xla_cpu_multi_thread_eigen=false"


def execute(spec: dict[str, Any], workdir: str, compile_cache_dir: str | None = None) -> dict[str, Any]:
  """Runs one spec (a worker process's entry point)."""
  if spec["kind"] == "anchor":
    if spec.get("wide_eval"):
      from hybridjax.bench.runs.wide_eval_run import run_anchor_with_wide_eval

      return run_anchor_with_wide_eval(spec)
    from hybridjax.bench.runs.anchor_run import run_anchor

    return run_anchor(spec)
  from hybridjax.bench.runs.method_run import run_method

  return run_method(spec, workdir, compile_cache_dir)


def worker_xla_flags(flags: str) -> str:
  """A worker's XLA_FLAGS: the driver's `flags` with XLA:CPU on one thread."""
  return flags if SINGLE_THREAD_FLAG in flags.split() else f"{flags} {SINGLE_THREAD_FLAG}".strip()


def init_worker(counter: Any, cores: list[int], cache_dir: str | None) -> None:
  """A local worker: one CPU core (its index in the pool's `counter`) and one XLA thread."""
  with counter.get_lock():
    index = counter.value
    counter.value += 1
  if cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {cores[index % len(cores)]})
  os.environ["XLA_FLAGS"] = worker_xla_flags(os.environ.get("XLA_FLAGS", ""))
  enable_cache(cache_dir)
  threading.Thread(target=exit_with_parent, args=(os.getppid(),), daemon=True).start()


def exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
  """Ends this process once `parent` (the benchmark's driver) is gone. A driver killed by a signal closes
  no pool, and its workers would otherwise train on for no one; only the driver writes the run cache, so an
  unfinished run is lost, and nothing already cached."""
  while os.getppid() == parent:
    time.sleep(poll_s)
  os._exit(1)


def enable_cache(cache_dir: str | None) -> None:
  """JAX's persistent compilation cache in `cache_dir` (None: off)."""
  if cache_dir is not None:
    import ml_collections

    from hybridjax.loop import train as train_lib

    train_lib.enable_compile_cache(ml_collections.ConfigDict({"compile_cache": True, "compile_cache_dir": cache_dir}))
