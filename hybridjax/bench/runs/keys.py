"""The run cache's keys: a run's spec (the whole experiment config, the task, the arm) and the code
the run executes, found from the source: the modules its runner imports (`RUNNER_MODULES`), its
task's and its method's modules, and what those import, transitively (read with `ast`), each hashed
as its code (`code.code_lines`: tokens without docstrings, comments or layout) and named by its content,
not its place, so a pure move keeps every key; of the libraries, their versions. Why this and not a
list of files, and what a move keeps: docs/design.md, "The run cache's keys".
"""

from __future__ import annotations

import ast
import collections
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
from hybridjax.bench.runs.code import read_code
from hybridjax.bench.specs import task_name

# The module each kind of run executes (`runs.worker`'s two entry points import no more).
RUNNER_MODULES = {"anchor": "hybridjax.bench.runs.anchor_run", "method": "hybridjax.bench.runs.method_run"}
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


def _package_of(module: str, path: str) -> str:
  """The package a relative import in `module` (file `path`) starts from."""
  return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
  """The absolute module name a `from ... import` statement reads from."""
  base = node.module or ""
  if not node.level:
    return base
  parts = package.split(".")
  return ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))


def _imports(path: str, module: str) -> set[str]:
  """Every module `path` (module `module`) imports, at any depth, as absolute names."""
  package = _package_of(module, path)
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = _absolute(node, package)
      found.add(base)
      found.update(f"{base}.{a.name}" for a in node.names)
  return found


def _closure(module: str) -> tuple[dict[str, str], tuple[str, ...]]:
  """({name: source file} of `module` and of every non-library module it imports, transitively; the
  top-level names of the installed, non-standard modules those import directly)."""
  found, libraries = _closure_on_path(module, tuple(sys.path))  # where a name's file is depends on sys.path
  return dict(found), libraries


@functools.cache
def _closure_on_path(module: str, path: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
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
  return tuple(sorted((n, p) for n, p in seen.items() if p)), tuple(sorted(libraries))


def source_closure(module: str) -> tuple[str, ...]:
  """The source files of `module` and of every non-library module it imports, transitively."""
  return tuple(sorted(set(_closure(module)[0].values())))


def _bindings(
  node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, str]
) -> tuple[list[list[str | None]], list[str]]:
  """What an import statement binds, without the paths of the closure's modules: each binding
  (a module of the closure: ['module', bound name]; an attribute of one: ['attribute', its name,
  bound name]; a library's: its names as written; `import a.b` binding `a`: its dotted path as
  written), and the closure's modules it names, in order (each binding's, the dotted path's every
  prefix)."""
  out: list[list[str | None]] = []
  refs: list[str] = []
  if isinstance(node, ast.Import):
    for a in node.names:
      if a.name in modules and (a.asname or "." not in a.name):
        out.append(["module", a.asname or a.name])
        refs.append(a.name)
      else:  # a library's, or `import a.b`, which binds `a`: its code names the path
        out.append(["import", a.name, a.asname])
        parts = a.name.split(".")
        refs += [m for m in (".".join(parts[: k + 1]) for k in range(len(parts))) if m in modules]
    return out, refs
  base = _absolute(node, package)
  for a in node.names:
    if f"{base}.{a.name}" in modules:
      out.append(["module", a.asname or a.name])
      refs.append(f"{base}.{a.name}")
    elif base in modules:
      out.append(["attribute", a.name, a.asname or a.name])
      refs.append(base)
    else:
      out.append(["from", base, a.name, a.asname])
  return out, refs


def _sha(*parts: str) -> str:
  return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


# The hash standing for a module of the closure with no code: all such modules are alike.
_NO_CODE = "no code"


@functools.lru_cache(maxsize=64)
def _module_hashes(files: tuple[tuple[str, str, bytes], ...]) -> dict[str, str]:
  """{name: content address} of each module of the closure (`files`: (name, path, content)) that
  has code: its code with its imports read as what they bind (`_bindings`), refined by the
  addresses of the modules it imports until they tell apart every module they can (colour
  refinement); modules alike all the way down are then told apart by their names. Cached by
  content: a benchmark keys each of its runs."""
  modules = {name: path for name, path, _ in files}
  code: dict[str, str] = {}
  imported: dict[str, list[str]] = {}
  for name, path, data in files:
    lines, imports = read_code(data)
    if not lines:
      continue
    package = _package_of(name, path)
    refs: list[str] = []
    bound = []
    for node, _ in imports:
      binds, named = _bindings(node, package, modules)
      bound.append(binds)
      refs += named
    code[name] = _sha(json.dumps([[d, [bound[x] if isinstance(x, int) else x for x in items]] for d, items in lines]))
    imported[name] = refs

  def refine(colour: dict[str, str]) -> dict[str, str]:
    # Each round: a module's address, and those of the modules it imports, in its order.
    while True:
      new = {n: _sha(c, *(colour.get(r, _NO_CODE) for r in imported[n])) for n, c in colour.items()}
      stable = len(set(new.values())) == len(set(colour.values()))
      colour = new
      if stable:
        return colour

  colour = refine(code)
  alike = collections.Counter(colour.values())
  if any(n > 1 for n in alike.values()):
    colour = refine({n: _sha(c, n) if alike[c] > 1 else c for n, c in colour.items()})
  return colour


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
  """A hash of the code of `modules` and of everything they import (without docstrings, comments,
  layout, file names or paths: this module's docstring says what it keeps), and of the libraries'
  versions."""
  closure: dict[str, str] = {}
  for m in modules:
    closure.update(_closure(m)[0])
  files = []
  for name, path in sorted(closure.items()):
    with open(path, "rb") as f:
      files.append((name, path, f.read()))
  addresses = _module_hashes(tuple(files))
  h = hashlib.sha256()
  for address in sorted(addresses.values()):
    h.update(address.encode())
  # Which modules are the run's entry points (the task's, the method's: loaded by name).
  for root in sorted({addresses.get(m, _NO_CODE) if m in closure else f"library {m}" for m in modules}):
    h.update(f"root {root}".encode())
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
