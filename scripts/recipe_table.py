"""The README's "what trains faster" table, generated from the published recipe runs.

  python scripts/recipe_table.py            # print the table
  python scripts/recipe_table.py --update   # rewrite it in README.md (between the markers)

Every cell comes from `docs/results/recipe/recipe-<preset>.json`, which
`python -m experiments.benchmark --config=experiments/configs/benchmark.py:<preset>
--config.benchmark.recipe=True --config.benchmark.publish=docs/results/recipe` writes (with every step
per seed in recipe-<preset>.md); tests/test_docs.py checks that the README's table is this script's
output and tests/bench/test_ladder.py that every figure in the files recomputes from their runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "docs", "results", "recipe")
README = os.path.join(ROOT, "README.md")
START, END = "<!-- recipe-table:start -->", "<!-- recipe-table:end -->"
ORDER = ("long", "tiny")  # the headline scale first

sys.path.insert(0, ROOT)
from hybridjax.bench import report  # noqa: E402


def load() -> dict[str, dict]:
  """{preset: parsed recipe-<preset>.json} of every published recipe, headline scale first."""
  out = {}
  for path in glob.glob(os.path.join(RECIPE, "recipe-*.json")):
    with open(path) as f:
      result = json.load(f)
    out[result["preset"]] = result
  return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def tables(results: dict[str, dict]) -> str:
  """The table over every published scale, then one line per scale on what it ran."""
  scales = "\n".join(
    f"* {report.recipe_scale(r)}; [every step, per seed](docs/results/recipe/recipe-{p}.md)."
    for p, r in results.items()
  )
  return report.recipe_table(list(results.values())) + "\n\n" + scales


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--update", action="store_true", help="rewrite the table in README.md")
  args = parser.parse_args()
  text = tables(load())
  if not args.update:
    print(text)
    return
  report.replace_between_markers(README, START, END, text)
  print(f"updated {README}")


if __name__ == "__main__":
  main()
