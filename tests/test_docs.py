"""Generated documentation stays in sync with the code."""

from __future__ import annotations

import os
import runpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "config_reference.py")


def test_readme_config_reference_matches_the_configs():
  ref = runpy.run_path(SCRIPT)
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    current = ref["readme_block"](f.read())
  assert current is not None, (
      "README.md lost its config reference markers; restore the 'Config reference' section with\n"
      f"{ref['START']}\n{ref['END']}\nand run `python scripts/config_reference.py --update`")
  expected = ref["reference_table"]()
  if current != expected:
    stale = sorted(set(current.splitlines()) ^ set(expected.splitlines()))
    raise AssertionError(
        "README.md's config reference is out of date with experiments/configs/gpt2_small.py and "
        "hybridjax/config.py. Regenerate it with `python scripts/config_reference.py --update`.\n"
        "Differing rows:\n  " + "\n  ".join(stale[:20]))


def test_config_reference_covers_every_field_with_the_tiny_defaults():
  from experiments.configs import gpt2_small
  table = runpy.run_path(SCRIPT)["reference_table"]()
  rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2].strip()
          for line in table.splitlines()[2:]}
  config = gpt2_small.get_config("tiny")
  flat = {}

  def walk(node, prefix=""):
    for k, v in node.items():
      if hasattr(v, "items"):
        walk(v, f"{prefix}{k}.")
      else:
        flat[f"{prefix}{k}"] = v

  walk(config)
  assert set(rows) == set(flat)
  assert rows["optim.learning_rate"] == f"`{config.optim.learning_rate!r}`"
  assert rows["hybrid.health.cooldown_steps"] == "`50`"
  assert "'sgd'" in table and "\\|" in table  # comments made it in, pipes escaped
