"""One run of a spec, in this process or a worker: the entry point of the runner's workers. An anchor
runs through the baseline loop (`anchor_run`), a method arm through `train()` (`method_run`)."""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from hybridjax.loop import train as train_lib


def execute(spec: dict[str, Any], workdir: str, compile_cache_dir: str | None = None) -> dict[str, Any]:
  """Runs one spec (a worker process's entry point)."""
  if spec["kind"] == "anchor":
    from hybridjax.bench.anchor_run import run_anchor

    return run_anchor(spec)
  from hybridjax.bench.method_run import run_method

  return run_method(spec, workdir, compile_cache_dir)


def init_worker(counter: Any, cores: list[int], cache_dir: str | None) -> None:
  """A worker: one CPU core and one XLA thread (small models are overhead-bound; two single-thread
  processes get more steps per second from 2 cores than one two-thread process)."""
  with counter.get_lock():
    index = counter.value
    counter.value += 1
  if cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {cores[index % len(cores)]})
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
  enable_cache(cache_dir)


def enable_cache(cache_dir: str | None) -> None:
  """JAX's persistent compilation cache in `cache_dir` (None: off)."""
  if cache_dir is not None:
    train_lib.enable_compile_cache(ml_collections.ConfigDict({"compile_cache": True, "compile_cache_dir": cache_dir}))
