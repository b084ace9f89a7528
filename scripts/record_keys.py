"""The run cache's keys of the three studies, recorded, so that a change to them is seen.

  python scripts/record_keys.py            # check: exits 1, with the differences, when today's keys differ
  python scripts/record_keys.py --update   # rewrite the record (tests/data/run_keys.json)

For each preset (`quick`, `tiny`, `long`; experiments/configs/benchmark.py) and each study (the
family benchmark, the ladder, the recipe), the record holds `codehash.code_version` of every (runner,
task, method) whose runs the study trains, and `keys.run_key` of one spec per study and run kind (an
anchor, a method arm) at a fixed LR. A run's key names its file in the run cache: when a key changes,
every cached run it names would retrain. tests/bench/runs/test_keys.py checks the record against the code;
after an intended change to the code the runs execute (or to the experiment config, which every
spec holds), re-record it. The record holds the library versions its keys were computed with
(`libraries`); the check computes today's keys under those, so on a machine with other versions it
still checks the code and the configs (and says which versions differ: under them every key
differs). Building the keys trains nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "tests", "data", "run_keys.json")
PRESETS = ("quick", "tiny", "long")
LR = 1e-3  # the fixed LR of the recorded run keys' specs
CHANGED = (
  "the runs' code changed, so every cached run these keys name would retrain; if that is intended, "
  "re-record with `python scripts/record_keys.py --update`"
)

sys.path.insert(0, ROOT)
from experiments.configs import benchmark as benchmark_cfg  # noqa: E402
from hybridjax import codehash, registry  # noqa: E402
from hybridjax.bench import arms as arms_lib  # noqa: E402
from hybridjax.bench import specs, tasks, tuning  # noqa: E402
from hybridjax.bench.runs import keys  # noqa: E402
from hybridjax.bench.studies.ladder import run as ladder_run  # noqa: E402
from hybridjax.bench.studies.ladder import rungs as ladder_rungs  # noqa: E402
from hybridjax.bench.studies.recipe import run as recipe_run  # noqa: E402


def _combos(config: Any, methods: list[str]) -> dict[str, list[str]]:
  """{'anchor <task>' | 'method <task> <method>': the modules its runs execute} of a study's config:
  its anchors, and the arms in `methods` (arms sharing a method share its code)."""
  task = specs.task_name(config)
  out = {f"anchor {task}": [keys.RUNNER_MODULES["anchor"], tasks.task_path(task)]}
  defined = arms_lib.arms(config)
  for arm in methods:
    method = defined[arm].method
    out[f"method {task} {method}"] = [
      keys.RUNNER_MODULES["method"],
      tasks.task_path(task),
      registry.method_path(method),
    ]
  return out


def study_modules(preset: str) -> dict[str, dict[str, list[str]]]:
  """{study: {(runner, task, method) combination: its modules}} of what each study trains at `preset`."""
  c = benchmark_cfg.get_config(preset)
  seeds = [int(s) for s in c.benchmark.seeds]
  family = _combos(c, arms_lib.names(c.benchmark.methods))
  rungs: dict[str, list[str]] = {}
  for rung in ladder_rungs.rungs_of(c):
    group = ladder_rungs.RUNGS[rung].group
    rungs |= _combos(ladder_rungs.group_config(c, group, seeds), ladder_rungs.arms_at(c, group))
  steps: dict[str, list[str]] = {}
  for step in recipe_run.step_configs(c, LR).values():
    steps |= _combos(step, [])
  return {"family": family, "ladder": rungs, "recipe": _combos(recipe_run.anchor_config(c, []), []) | steps}


def example_specs(preset: str) -> dict[str, dict[str, Any]]:
  """One spec per study and run kind at `preset`, at the LR `LR` and the first headline seed: the
  family's N-step anchor and its first arm; the ladder's first rung's anchor and its first arm; the
  recipe's last step (an anchor run, as every recipe run is)."""
  c = benchmark_cfg.get_config(preset)
  b = c.benchmark
  n, seed, beta = int(c.trainer.steps), int(b.seeds[0]), float(b.betas[0])
  out = {
    "family anchor": specs.run_spec(c, kind="anchor", seed=seed, lr=LR, steps=n, beta=beta),
    "family method": tuning.method_specs(c, arms_lib.names(b.methods)[:1], LR, beta)[0],
  }
  group = ladder_rungs.RUNGS[ladder_rungs.rungs_of(c)[0]].group
  g = ladder_rungs.group_config(c, group, [seed])
  if group in ladder_rungs.CONSTANT_GROUPS:
    out["ladder anchor"] = ladder_run.constant_curve_spec(g, seed, LR)
  else:
    out["ladder anchor"] = specs.run_spec(g, kind="anchor", seed=seed, lr=LR, steps=n, beta=beta)
  out["ladder method"] = tuning.method_specs(g, ladder_rungs.arms_at(c, group)[:1], LR, beta)[0]
  last = list(recipe_run.step_configs(c, LR).values())[-1]
  out["recipe anchor"] = tuning.spec_of(last)(seed, LR, n)
  return out


@contextlib.contextmanager
def _libraries_at(versions: dict[str, str] | None) -> Iterator[None]:
  """Keys computed as if the libraries in `versions` were installed at those versions (the others
  as they are); None: as installed."""
  installed = codehash.installed_versions
  if versions is not None:
    codehash.installed_versions = lambda names: {n: versions.get(n) or installed([n])[n] for n in names}
  try:
    yield
  finally:
    codehash.installed_versions = installed


def current(libraries: dict[str, str] | None = None) -> dict[str, Any]:
  """The keys today's code and configs give (what the record holds), with the library versions in
  `libraries` (None: those installed). Its 'libraries': the versions the keys hold."""
  out: dict[str, Any] = {"libraries": {}}
  with _libraries_at(libraries):
    for preset in PRESETS:
      studies = study_modules(preset)
      versions = {
        study: {combo: codehash.code_version(modules) for combo, modules in sorted(combos.items())}
        for study, combos in studies.items()
      }
      run_keys = {}
      for name, spec in example_specs(preset).items():
        label = f"{name} {spec['method']}" if spec["kind"] == "method" else name
        run_keys[label] = keys.run_key(spec)
      out[preset] = {"code_versions": versions, "run_keys": run_keys}
      for combos in studies.values():
        for modules in combos.values():
          out["libraries"] |= codehash.library_versions(modules)
  return out


def check(recorded: dict[str, Any]) -> tuple[str, dict[str, tuple[str, str]]]:
  """(the record against today's code and configs, under the record's library versions, as a
  unified diff: '' when they agree; {library: (recorded, installed)} where the installed version
  differs, under which every key differs too)."""
  diff = differences(recorded, current(recorded.get("libraries", {})))
  installed = codehash.installed_versions(sorted(recorded.get("libraries", {})))
  moved = {n: (v, installed[n]) for n, v in recorded.get("libraries", {}).items() if installed[n] != v}
  return diff, moved


def dump(record: dict[str, Any]) -> str:
  return json.dumps(record, indent=1, sort_keys=True) + "\n"


def differences(recorded: dict[str, Any], today: dict[str, Any]) -> str:
  """The record against today's keys, as a unified diff ('' when they agree)."""
  return "".join(
    difflib.unified_diff(
      dump(recorded).splitlines(keepends=True),
      dump(today).splitlines(keepends=True),
      "tests/data/run_keys.json (recorded)",
      "today's keys",
    )
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--update", action="store_true", help="rewrite tests/data/run_keys.json")
  args = parser.parse_args()
  if args.update:
    with open(RECORD, "w") as f:
      f.write(dump(current()))
    print(f"wrote {os.path.relpath(RECORD, ROOT)}")
    return
  with open(RECORD) as f:
    recorded = json.load(f)
  diff, moved = check(recorded)
  if moved:
    print(
      "the installed libraries are not the record's ("
      + ", ".join(f"{n} {a} -> {b}" for n, a, b in ((n, *v) for n, v in sorted(moved.items())))
      + "): under them every key differs and every cached run would retrain; compared under the record's",
      file=sys.stderr,
    )
  if diff:
    print(diff + "\n" + CHANGED, file=sys.stderr)
    sys.exit(1)
  print(f"the run keys agree with {os.path.relpath(RECORD, ROOT)}")


if __name__ == "__main__":
  main()
