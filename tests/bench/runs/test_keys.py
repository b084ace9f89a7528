"""The run cache's keys: what of the code they hash (its code, not its prose, names or places), and
the record of the studies' keys (tests/data/run_keys.json, scripts/record_keys.py)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
from conftest import load_script

from hybridjax import codehash
from hybridjax.bench.runs import keys

SOURCE = (
  "# -*- coding: latin-1 -*-\n"
  '"""The module\'s docstring."""\n'
  "\n"
  "from __future__ import annotations\n"
  "import os  # a comment\n"
  "\n"
  'NOTE = "a string, not a docstring"\n'
  '"a string statement after the first: code too"\n'
  "\n"
  "\n"
  "class Scaled:\n"
  "  '''The class's docstring.'''\n"
  "\n"
  "  def __call__(self, x,\n"
  "               y):  # a comment in a statement\n"
  '    """A method\'s docstring."""\n'
  "    total = x + \\\n"
  "      y\n"
  "    return f\"{total!r:>{os.sep}} {{braces}} {f'{x}'}\"\n"
  "\n"
  "\n"
  'async def nothing(): "only a docstring"\n'
)
# The code the key reads from SOURCE: each logical line's indentation depth and its tokens' source
# text. Neither comes from a token type or from `ast.dump`, and an f-string is its source text on
# every Python (one token before 3.12, a run of tokens since): so the same on 3.11 and later.
CODE = [
  (0, ("from", "__future__", "import", "annotations")),
  (0, ("import", "os")),
  (0, ("NOTE", "=", '"a string, not a docstring"')),
  (0, ('"a string statement after the first: code too"',)),
  (0, ("class", "Scaled", ":")),
  (1, ("def", "__call__", "(", "self", ",", "x", ",", "y", ")", ":")),
  (2, ("total", "=", "x", "+", "y")),
  (2, ("return", "f\"{total!r:>{os.sep}} {{braces}} {f'{x}'}\"")),
  (0, ("async", "def", "nothing", "(", ")", ":")),
]


def test_a_files_code_is_its_tokens_without_prose_or_layout():
  """Comments, docstrings, blank lines, the spacing, the indent's width, line continuations, line
  endings and the encoding are not code; a string that is not a docstring is."""
  assert codehash.code_lines(SOURCE.encode("latin-1")) == CODE
  assert codehash.code_lines(SOURCE.replace("\n", "\r\n").encode("latin-1")) == CODE
  assert codehash.code_lines(SOURCE.replace("# -*- coding: latin-1 -*-\n", "").encode("utf-8")) == CODE
  relaid = SOURCE.replace("x + \\\n      y", "x+y").replace("x,\n               y", "x, y").replace("\n  ", "\n    ")
  assert relaid != SOURCE and codehash.code_lines(relaid.encode("latin-1")) == CODE
  # Python's own reading agrees that a string statement after the first is no docstring.
  namespace: dict = {}
  exec(compile(SOURCE.split("class Scaled")[0], "<source>", "exec"), namespace)
  assert namespace["__doc__"] == "The module's docstring." and namespace["NOTE"] == "a string, not a docstring"
  assert codehash.code_lines('"""Only a docstring."""\n# and a comment\n') == []


@pytest.fixture
def version_of(tmp_path):
  """The code version of `roots` with `files` ({path: text}) as the only code on a sys.path entry
  of their own: each call a fresh folder, its modules forgotten after (the same package names recur)."""
  count = iter(range(100))

  def version(files: dict[str, str], roots: list[str]) -> str:
    folder = tmp_path / f"tree{next(count)}"
    for path, text in files.items():
      (folder / path).parent.mkdir(parents=True, exist_ok=True)
      (folder / path).write_text(text)
    tops = {path.split("/")[0].removesuffix(".py") for path in files}
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
      return codehash.code_version(roots)
    finally:
      sys.path.remove(str(folder))
      for name in [n for n in sys.modules if n.split(".")[0] in tops]:
        del sys.modules[name]

  return version


HELPER = '''"""Helps."""


def double(x):
  """Twice x."""
  return 2 * x


def scale(x):
  return 3 * x
'''
RUNNER = '''"""Runs."""

from pkg import helper
from pkg.helper import scale as s

from . import other


def run(x):
  # why: a comment
  return helper.double(x) + s(x) + other.VALUE
'''
TREE = {
  "pkg/__init__.py": '"""A package."""\n',
  "pkg/runner.py": RUNNER,
  "pkg/helper.py": HELPER,
  "pkg/other.py": "VALUE = 1\n",
}


def test_prose_edits_and_moves_keep_the_code_version(version_of):
  """A docstring, a comment, a file's place: none is code. A module moved unchanged into a
  subpackage, with its importers' import lines (absolute or relative) following it, keeps the key,
  and so does the runner itself moved; a file with no code adds nothing."""
  base = version_of(TREE, ["pkg.runner"])
  assert version_of(TREE, ["pkg.runner"]) == base  # a fresh tree: no cache answers for it
  prose = TREE | {
    "pkg/__init__.py": '"""The package, reworded."""\n# and a comment\n',
    "pkg/helper.py": HELPER.replace("Twice x.", "x, doubled.").replace('"""Helps."""', "# Helps."),
    "pkg/runner.py": RUNNER.replace("# why: a comment", "# a comment, rewritten"),
  }
  assert version_of(prose, ["pkg.runner"]) == base
  assert version_of(TREE | {"pkg/__init__.py": ""}, ["pkg.runner"]) == base
  moved = {k: v for k, v in TREE.items() if k != "pkg/helper.py"} | {
    "pkg/sub/__init__.py": '"""A subpackage holding only its docstring."""\n',
    "pkg/sub/helper.py": HELPER,
    "pkg/runner.py": RUNNER.replace("from pkg import helper", "from pkg.sub import helper").replace(
      "from pkg.helper import", "from .sub.helper import"
    ),
  }
  assert version_of(moved, ["pkg.runner"]) == base
  runner_moved = {k: v for k, v in TREE.items() if k != "pkg/runner.py"} | {
    "pkg/sub/__init__.py": "",
    "pkg/sub/runner.py": RUNNER.replace("from . import other", "from .. import other"),
  }
  assert version_of(runner_moved, ["pkg.sub.runner"]) == base


def test_code_edits_change_the_code_version(version_of):
  """Any change to what runs re-keys: a statement, a string that is not a docstring, code in a
  package's __init__, which module an import names, even between two modules of the same code, and
  which modules are the run's entry points (a task or a method, loaded by name)."""
  base = version_of(TREE, ["pkg.runner"])
  assert version_of(TREE | {"pkg/helper.py": HELPER.replace("3 * x", "4 * x")}, ["pkg.runner"]) != base
  note = TREE | {"pkg/other.py": 'VALUE = 1\n"a note"\n'}
  assert version_of(note, ["pkg.runner"]) != base
  assert version_of(TREE | {"pkg/other.py": 'VALUE = 1\n"another note"\n'}, ["pkg.runner"]) != version_of(
    note, ["pkg.runner"]
  )
  assert version_of(TREE | {"pkg/__init__.py": '"""A package."""\nLIMIT = 2\n'}, ["pkg.runner"]) != base
  assert version_of(TREE, ["pkg.runner", "pkg.helper"]) != version_of(TREE, ["pkg.runner", "pkg.other"])
  # A second helper, imported beside the first: which one `scale` comes from is part of the key.
  for twin in (HELPER.replace("3 * x", "5 * x"), HELPER):  # other code; the same code
    both = TREE | {"pkg/helper2.py": twin, "pkg/runner.py": RUNNER.replace("import helper", "import helper, helper2")}
    swapped = both | {"pkg/runner.py": both["pkg/runner.py"].replace("pkg.helper import", "pkg.helper2 import")}
    assert version_of(both, ["pkg.runner"]) != version_of(swapped, ["pkg.runner"])


def test_the_studies_keys_are_the_recorded_ones(monkeypatch):
  """Every (runner, task, method) code version the family benchmark, the ladder and the recipe use
  at quick, tiny and long, and one run key per study and run kind, as recorded (under the record's
  library versions, so another machine's libraries do not fail it)."""
  record_keys = load_script("record_keys")
  with open(record_keys.RECORD) as f:
    recorded = json.load(f)
  diff, _ = record_keys.check(recorded)
  assert not diff, f"{record_keys.CHANGED}\n{diff}"
  # Another jax installed: compared under the record's versions all the same, and named.
  installed = codehash.installed_versions
  monkeypatch.setattr(codehash, "installed_versions", lambda names: installed(names) | {"jax": "0.0.1"})
  diff, moved = record_keys.check(recorded)
  assert not diff and moved == {"jax": (recorded["libraries"]["jax"], "0.0.1")}
  # And a key that differs is a difference.
  recorded["quick"]["run_keys"]["family anchor"] = "0" * 20
  assert '-   "family anchor": "00000000000000000000"' in record_keys.check(recorded)[0]


@pytest.mark.parametrize(
  "name, field, value",
  [
    ("adamw", "adamw_embed_lr_ratio", 0.5),
    ("adamw", "adamw_head_lr_ratio", 2.0),
    ("muon", "muon_momentum", 0.9),
    ("muon_groups", "groups_lr_scale", 0.5),
  ],
)
def test_the_tuning_knobs_reach_a_runs_key(name, field, value):
  """A run's spec holds its whole experiment config, so each optimizer knob's value is in its key."""
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import specs

  c = benchmark_cfg.get_config("quick")
  c.optim.name = name
  spec = lambda config: specs.run_spec(config, kind="anchor", seed=1, lr=0.01, steps=40, beta=0.9)
  base = keys.run_key(spec(c))
  assert c.optim[field] != value
  c.optim[field] = value
  assert spec(c)["config"]["optim"][field] == value
  assert keys.run_key(spec(c)) != base
