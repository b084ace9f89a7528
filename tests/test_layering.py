"""The package's layers, read from its source with `ast` (no module is imported).

  schema           imports nothing from hybridjax (the field declarations every layer builds on)
  optim            imports only optimizers/ (the built-in optimizers and a user's optimizer's checks,
                   which import only optimizers/ and schema) and schema
  hybrid/          imports only hybrid/ and optim (plus jax, flax, optax, chex, numpy)
  infrastructure   config, identity, preflight, registry, data, checkpoint, memory, sharding, writers, plotting,
                   codehash, models/, tasks/ (the benchmark's built-in tasks):
                   may import each other and hybrid.phases, never a method or the loop (the registry
                   loads methods by name, with importlib)
  methods/         the training methods: import hybrid/, optim and infrastructure, never the loop;
                   no module below them imports one
  loop/            imports anything below it; cli imports the loop
  bench/           the benchmark as a library: above the loop (imports it and anything below), never
                   imported by anything in the package below it, nor named there (no field, check or
                   message outside bench/ names the benchmark); `experiments` sits above it

and no import cycle anywhere. One test builds configs: no block the trainer checks is the benchmark's.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybridjax"
HYBRID_THIRD_PARTY = {"jax", "flax", "optax", "chex", "numpy"}  # besides the standard library


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path) -> set[str]:
  """Every module `path` imports (absolute names; `from hybridjax import x` gives hybridjax.x when
  hybridjax/x is a module), at any depth, including imports inside functions, and every module of
  the package it names in a string (`importlib.import_module(name)` loads those: the registry's
  built-in methods, the lazy attributes of `hybridjax`)."""
  found: set[str] = set()
  package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
      for alias in node.names:
        candidate = f"{base}.{alias.name}"
        found.add(candidate if _is_module(candidate) else base)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_module(node.value):
      found.add(node.value)  # a module imported by name
  return found


def _is_module(name: str) -> bool:
  rel = pathlib.Path(*name.split(".")[1:])
  return name.startswith("hybridjax.") and (
    (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()
  )


def graph() -> dict[str, set[str]]:
  """module -> the hybridjax modules it imports."""
  g = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    g[module_name(path)] = {m for m in imports_of(path) if m == "hybridjax" or m.startswith("hybridjax.")}
  return g


def _third_party(path: pathlib.Path) -> set[str]:
  tops = {m.split(".")[0] for m in imports_of(path) if not m.startswith("hybridjax")}
  return tops - set(sys.stdlib_module_names)


def test_the_import_graph_has_no_cycle():
  g = graph()
  state: dict[str, int] = {}  # 1 = on the stack, 2 = done

  def visit(m: str, stack: list[str]) -> None:
    state[m] = 1
    for n in sorted(g.get(m, ())):
      if n not in g:
        continue
      if state.get(n) == 1:
        cycle = stack[stack.index(n) :] + [m, n] if n in stack else [m, n]
        pytest.fail("import cycle: " + " -> ".join(cycle))
      if n not in state:
        visit(n, stack + [m])
    state[m] = 2

  for m in g:
    if m not in state:
      visit(m, [])


def test_optim_imports_only_the_optimizers_and_the_schema():
  g = graph()
  assert g["hybridjax.schema"] == set()
  optimizers = {m for m in g if m == "hybridjax.optimizers" or m.startswith("hybridjax.optimizers.")}
  for m in optimizers:
    assert g[m] <= optimizers | {"hybridjax.schema"}, (m, g[m])
  assert g["hybridjax.optim"] <= optimizers | {"hybridjax.schema"}


def test_the_hybrid_algorithm_imports_only_itself_and_optim():
  for path in sorted((PACKAGE / "hybrid").rglob("*.py")):
    own = {m for m in imports_of(path) if m.startswith("hybridjax")}
    outside = {m for m in own if not (m.startswith("hybridjax.hybrid") or m == "hybridjax.optim")}
    assert not outside, f"{module_name(path)} imports {sorted(outside)}: hybrid/ may import only hybrid/ and optim"
    extra = _third_party(path) - HYBRID_THIRD_PARTY
    assert not extra, f"{module_name(path)} imports {sorted(extra)}: hybrid/ is pure (jax, flax, optax, chex, numpy)"


def test_a_checkpoint_reads_the_config_identity_below_it_not_the_checks_nor_the_models():
  """A resume and a published record compare configs by one definition (`identity`), which both
  import; the checkpoint imports neither the pre-flight nor a model."""
  g = graph()
  above = {d for d in g["hybridjax.checkpoint"] if d == "hybridjax.preflight" or d.startswith("hybridjax.models")}
  assert not above, f"hybridjax.checkpoint imports {sorted(above)}"
  assert "hybridjax.identity" in g["hybridjax.checkpoint"] & g["hybridjax.bench.record"]


def test_only_the_loop_and_the_cli_import_the_loop():
  for m, deps in graph().items():
    # `hybridjax` itself names `train` for `hybridjax.train`, imported lazily (by name) on first use.
    if m.startswith(("hybridjax.loop", "hybridjax.bench")) or m in ("hybridjax", "hybridjax.cli"):
      continue
    assert not any(d.startswith("hybridjax.loop") or d == "hybridjax.cli" for d in deps), (
      f"{m} imports the loop: only hybridjax.loop and hybridjax.cli may"
    )


def test_methods_sit_between_the_algorithm_and_the_loop():
  for m, deps in graph().items():
    if m.startswith("hybridjax.methods"):
      above = {d for d in deps if d.startswith(("hybridjax.loop", "hybridjax.bench")) or d == "hybridjax.cli"}
      assert not above, f"{m} imports {sorted(above)}: a method imports only the algorithm and below"
    elif not m.startswith(("hybridjax.loop", "hybridjax.bench")) and m not in (
      "hybridjax",
      "hybridjax.cli",
      "hybridjax.registry",
    ):
      # The registry loads the built-in methods by name; whatever imports it reaches them through it,
      # so a method that imported one of those back would close a cycle (test_the_import_graph_has_no_cycle).
      methods = {d for d in deps if d.startswith("hybridjax.methods")}
      assert not methods, f"{m} imports {sorted(methods)}: only the loop and above may import a method"


def test_the_benchmark_sits_above_the_loop():
  g = graph()
  for m, deps in g.items():
    if not m.startswith("hybridjax.bench"):
      assert not any(d.startswith("hybridjax.bench") for d in deps), f"{m} imports the benchmark library"
  # It builds on the loop (its anchors run the baseline loop, its arms `train()`).
  assert any(d.startswith("hybridjax.loop") for m, deps in g.items() if m.startswith("hybridjax.bench") for d in deps)
  # `experiments` sits above the whole package: nothing in it imports experiments, nor loads a module
  # of it by name (the benchmark's built-in tasks are the package's own).
  for path in sorted(PACKAGE.rglob("*.py")):
    assert not any(i.startswith("experiments") for i in imports_of(path)), f"{module_name(path)} imports experiments"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        assert not re.fullmatch(r"experiments(\.\w+)+", node.value), f"{module_name(path)} names {node.value!r}"


def _docstrings(tree: ast.AST) -> set[int]:
  return {
    id(n.body[0].value)
    for n in ast.walk(tree)
    if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
    and n.body
    and isinstance(n.body[0], ast.Expr)
    and isinstance(n.body[0].value, ast.Constant)
  }


def test_the_trainer_names_no_benchmark_and_reads_no_block_of_it():
  """Outside bench/ no string (a field, a check, an exemption, a message; docstrings aside) names the
  benchmark, and no block the trainer checks (`preflight.DECLARED`, the method blocks under
  `hybrid`) is one the benchmark's config declares."""
  for path in sorted(PACKAGE.rglob("*.py")):
    if path.relative_to(PACKAGE).parts[0] == "bench":
      continue
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        assert not re.search(r"bench", node.value, re.I), f"{module_name(path)} names the benchmark: {node.value!r}"
  from experiments.configs import benchmark as benchmark_cfg
  from experiments.configs import gpt2_small
  from hybridjax import preflight

  declared = set(benchmark_cfg.get_config("quick")) - set(gpt2_small.get_config("tiny"))
  assert declared == {"benchmark"} and not declared & set(preflight.DECLARED)


def test_the_benchmark_names_no_method():
  """The benchmark's arms are data (`config.benchmark.arms`): no string of hybridjax/bench names a
  built-in method (docstrings aside), so a method plug-in needs no edit of it."""
  registry = ast.parse((PACKAGE / "registry.py").read_text(encoding="utf-8"))
  builtin = next(
    ast.literal_eval(n.value)
    for n in ast.walk(registry)
    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "BUILTIN_METHODS"
  )
  names = re.compile(r"\b(" + "|".join(map(re.escape, builtin)) + r")\b|hybridjax\.methods")
  for path in sorted((PACKAGE / "bench").rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        assert not names.search(node.value), f"{module_name(path)} names a method: {node.value!r}"


def test_infrastructure_uses_only_the_phase_names_of_the_algorithm():
  infra = {"config", "registry", "data", "checkpoint", "memory", "sharding", "writers", "plotting", "codehash", "tasks"}
  for m, deps in graph().items():
    top = m.split(".")[1] if "." in m else ""
    if top in infra or top == "models":
      hybrid = {d for d in deps if d.startswith("hybridjax.hybrid")}
      assert hybrid <= {"hybridjax.hybrid.phases"}, f"{m} imports {sorted(hybrid)}"


def test_the_checks_can_fail(tmp_path, monkeypatch):
  # A cycle and a forbidden import in a fake package are found.
  fake = tmp_path / "hybridjax"
  (fake / "hybrid").mkdir(parents=True)
  (fake / "__init__.py").write_text("")
  (fake / "hybrid" / "__init__.py").write_text("")
  (fake / "optim.py").write_text("from hybridjax.hybrid import step\n")
  (fake / "hybrid" / "step.py").write_text("from hybridjax import optim\nfrom hybridjax import memory\n")
  (fake / "memory.py").write_text("import jax\n")
  monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
  assert graph()["hybridjax.optim"] == {"hybridjax.hybrid.step"}
  with pytest.raises(pytest.fail.Exception, match="import cycle"):
    test_the_import_graph_has_no_cycle()
  with pytest.raises(AssertionError, match="hybrid/ may import only"):
    test_the_hybrid_algorithm_imports_only_itself_and_optim()


def test_an_import_by_name_that_closes_a_loop_is_a_cycle(tmp_path, monkeypatch):
  # A config that loads methods by name through a registry, and a method that imports the config back.
  fake = tmp_path / "hybridjax"
  (fake / "methods").mkdir(parents=True)
  (fake / "__init__.py").write_text("")
  (fake / "methods" / "__init__.py").write_text("")
  (fake / "registry.py").write_text("import importlib\nBUILTIN = {'m': 'hybridjax.methods.m'}\n")
  (fake / "config.py").write_text("from hybridjax import registry\n")
  (fake / "methods" / "m.py").write_text("from hybridjax import config\n")
  monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
  assert graph()["hybridjax.registry"] == {"hybridjax.methods.m"}
  with pytest.raises(pytest.fail.Exception, match="import cycle"):
    test_the_import_graph_has_no_cycle()
  (fake / "methods" / "m.py").write_text("from hybridjax import fields\n")  # the checks from below config
  (fake / "fields.py").write_text("")
  test_the_import_graph_has_no_cycle()


if __name__ == "__main__":
  for mod, deps in graph().items():
    print(f"{mod} -> {', '.join(sorted(d.removeprefix('hybridjax.') for d in deps)) or '(nothing)'}")


def test_a_study_imports_no_other_study_but_the_ladder_reads_the_family_protocol():
  """bench/studies/<name>/ are the studies: none imports another, except the ladder's tuned rungs,
  which run the family protocol; only the skeleton (bench/study.py, by name) reaches a study."""
  for m, deps in graph().items():
    own = m.split(".")[3] if m.startswith("hybridjax.bench.studies.") else None
    for d in deps:
      if not d.startswith("hybridjax.bench.studies."):
        continue
      other = d.split(".")[3]
      if own is None:
        assert m == "hybridjax.bench.study", f"{m} imports the study {d}: only hybridjax.bench.study loads studies"
      elif other != own:
        assert (own, other) == ("ladder", "family"), f"{m} imports {d}: a study imports no other study"
