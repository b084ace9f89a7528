"""The run cache's keys: a run's spec (the whole experiment config, the task, the arm) and the code
the run executes (`codehash.code_version`): the modules its runner imports (`RUNNER_MODULES`), its
task's and its method's modules, and what those import, transitively, each hashed as its code and
named by its content, not its place, so a pure move keeps every key; of the libraries, their
versions. Why this and not a list of files, and what a move keeps: docs/design.md, "The run cache's keys".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from hybridjax import registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.specs import task_name
from hybridjax.bench.studies import Config, Record
from hybridjax.codehash import code_version, source_closure
from hybridjax.optimizers import module as module_lib

# The module each kind of run executes (`runs.worker`'s two entry points import no more).
RUNNER_MODULES = {"anchor": "hybridjax.bench.runs.anchor_run", "method": "hybridjax.bench.runs.method_run"}
WIDE_EVAL_MODULE = "hybridjax.bench.runs.wide_eval_run"  # an anchor spec's `wide_eval` (`specs.run_spec`)


def code_packages(modules: Sequence[str]) -> tuple[str, ...]:
  """The folders of the top-level packages (or the files of the top-level modules) that hold the
  source of `modules` and of what they import: the code a worker on another machine needs."""
  roots = set()
  for path in {p for m in modules for p in source_closure(m)}:
    root = os.path.abspath(path)  # stays the file where it is a module outside any package
    while os.path.exists(os.path.join(os.path.dirname(root), "__init__.py")):
      root = os.path.dirname(root)
    roots.add(root)
  return tuple(sorted(roots))


def spec_modules(spec: Record) -> list[str]:
  """The modules a spec's run executes: its runner's, its task's, its method's, and a user's optimizer
  module's (`optimizers.module`: its block in the spec's optim), so an edited optimizer re-keys its runs."""
  modules = [RUNNER_MODULES[spec["kind"]], tasks_lib.task_path(spec["task"])]
  if module_lib.BLOCK in spec["config"]["optim"]:
    modules.append(str(spec["config"]["optim"]["name"]))
  if spec.get("wide_eval"):  # an anchor that ends with a wide eval; only such a spec holds the field
    modules.append(WIDE_EVAL_MODULE)
  method = spec["config"].get("hybrid", {}).get("method")
  if spec["kind"] == "method" and method:
    modules.append(registry.method_path(method))
  return modules


def run_key(spec: Record) -> str:
  """The cache key of a run: its spec and the code it executes."""
  version = code_version(spec_modules(spec))
  return hashlib.sha256((json.dumps(spec, sort_keys=True) + version).encode()).hexdigest()[:20]


def code_versions(config: Config, methods: Sequence[str]) -> dict[str, str]:
  """The code version of the anchors' runs and of each arm's in `methods`: the hashes the run cache
  keys on, recorded in benchmark.json."""
  task = tasks_lib.task_path(task_name(config))
  defined = arms_lib.arms(config)
  return {"anchor": code_version([RUNNER_MODULES["anchor"], task])} | {
    m: code_version([RUNNER_MODULES["method"], task, registry.method_path(defined[m].method)]) for m in methods
  }
