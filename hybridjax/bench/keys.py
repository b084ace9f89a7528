"""The run cache's keys.

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

from hybridjax import registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.specs import task_name

# The module each kind of run executes (`hybridjax.bench.runs`' two entry points import no more).
RUNNER_MODULES = {"anchor": "hybridjax.bench.anchor_run", "method": "hybridjax.bench.method_run"}
# The distributions below the code whose versions enter every key (their files are not hashed),
# besides those the code imports directly: jaxlib, XLA's, is imported by jax alone.
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections")


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


@functools.cache
def _providers() -> dict[str, list[str]]:
  """Which installed distributions provide each top-level module. Reading it walks every installed
  distribution's file list (about half a second), so a process reads it once: every run key needs it."""
  return metadata.packages_distributions()


def _distributions(modules: Sequence[str]) -> list[str]:
  """The installed distributions whose versions enter the key: `LIBRARIES`, and those providing
  the top-level modules the code of `modules` imports."""
  providers = _providers()
  names = set(LIBRARIES)
  for m in modules:
    for top in _closure(m)[1]:
      names.update(providers.get(top, ()))
  return sorted(names, key=str.lower)


def installed_versions(distributions: Sequence[str]) -> dict[str, str]:
  """The installed version of each distribution ('absent' where it is not installed)."""
  versions = {}
  for lib in distributions:
    try:
      versions[lib] = metadata.version(lib)
    except metadata.PackageNotFoundError:
      versions[lib] = "absent"
  return versions


def library_versions(modules: Sequence[str]) -> dict[str, str]:
  """The version of each installed distribution whose version enters the key ('absent' if none)."""
  return installed_versions(_distributions(modules))


def code_version(modules: Sequence[str]) -> str:
  """A hash of the source of `modules` and everything they import, and of the libraries' versions."""
  h = hashlib.sha256()
  files = sorted({p for m in modules for p in source_closure(m)})
  for path in files:
    h.update(os.path.basename(path).encode())
    with open(path, "rb") as f:
      h.update(f.read())
  for lib, version in library_versions(modules).items():
    h.update(f"{lib} {version}".encode())
  return h.hexdigest()[:16]


def code_packages(modules: Sequence[str]) -> tuple[str, ...]:
  """The folders of the top-level packages (or the files of the top-level modules) that hold the
  source of `modules` and of what they import: the code a worker on another machine needs."""
  roots = set()
  for path in {p for m in modules for p in source_closure(m)}:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(os.path.join(folder, "__init__.py")):
      roots.add(os.path.abspath(path))  # a module outside any package
      continue
    while os.path.exists(os.path.join(os.path.dirname(folder), "__init__.py")):
      folder = os.path.dirname(folder)
    roots.add(folder)
  return tuple(sorted(roots))


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
