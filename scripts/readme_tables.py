"""The README's generated tables: the fairness ladder and the speedrun recipe, from the published runs.

  python scripts/readme_tables.py            # print both
  python scripts/readme_tables.py --update   # rewrite them in README.md (between their markers)

Every cell comes from `docs/results/<kind>/<kind>-<preset>.json`, which `python -m experiments.benchmark
--config=experiments/configs/benchmark.py:<preset> --config.benchmark.<kind>=True
--config.benchmark.publish=docs/results/<kind>` writes (with every figure per seed in
<kind>-<preset>.md); tests/test_docs.py checks that the README's tables are this script's output and
tests/bench/studies/test_ladder.py that every figure in the files recomputes from their runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
ORDER = ("deep", "long", "tiny")  # the headline scale first

sys.path.insert(0, ROOT)
from hybridjax.bench.studies.ladder import report as ladder_report  # noqa: E402
from hybridjax.bench.studies.recipe import report as recipe_report  # noqa: E402

# kind -> (the table over every scale, one scale's line, what its per-seed report holds)
KINDS = {
  "ladder": (ladder_report.ladder_table, ladder_report.ladder_scale, "every figure, per seed"),
  "recipe": (recipe_report.recipe_table, recipe_report.recipe_scale, "every step, per seed"),
}


def markers(kind: str) -> tuple[str, str]:
  """The README lines that enclose `kind`'s table."""
  return f"<!-- {kind}-table:start -->", f"<!-- {kind}-table:end -->"


def load(kind: str) -> dict[str, dict]:
  """{preset: parsed <kind>-<preset>.json} of every published `kind`, headline scale first."""
  out = {}
  for path in glob.glob(os.path.join(ROOT, "docs", "results", kind, f"{kind}-*.json")):
    with open(path) as f:
      result = json.load(f)
    out[result["preset"]] = result
  return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def tables(kind: str, results: dict[str, dict]) -> str:
  """`kind`'s table over every published scale, then one line per scale on what it ran. A recipe
  measured with an earlier trick list than the newest published one gets its line, not a column: its
  steps are other changes under the same names (docs/recipe.md)."""
  table, scale, link = KINDS[kind]
  newest = max((int(r.get("trick_list", 1)) for r in results.values()), default=1)
  columns = {p: r for p, r in results.items() if kind != "recipe" or int(r.get("trick_list", 1)) == newest}
  lines = [f"* {scale(r)}; [{link}](docs/results/{kind}/{kind}-{p}.md)." for p, r in columns.items()]
  changed = "docs/recipe.md#what-changed-from-the-first-trick-list"
  lines += [
    f"* Before the fixes (trick list {r.get('trick_list', 1)}, [what changed]({changed})): "
    f"{scale(r)}; [{link}](docs/results/{kind}/{kind}-{p}.md)."
    for p, r in results.items()
    if p not in columns
  ]
  return table(list(columns.values())) + "\n\n" + "\n".join(lines)


def replace_between_markers(path: str, start: str, end: str, text: str) -> None:
  """Rewrites what lies between the lines `start` and `end` of the file at `path` with `text` (a
  generated table in a README); a ValueError when the file lacks either marker."""
  with open(path) as f:
    content = f.read()
  if start not in content or end not in content:
    raise ValueError(f"{path} lacks the markers {start} ... {end}")
  head, rest = content.split(start, 1)
  _, tail = rest.split(end, 1)
  with open(path, "w") as f:
    f.write(f"{head}{start}\n{text}\n{end}{tail}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--update", action="store_true", help="rewrite the tables in README.md")
  args = parser.parse_args()
  for kind in KINDS:
    text = tables(kind, load(kind))
    if args.update:
      replace_between_markers(README, *markers(kind), text)
      print(f"updated {kind} table in {README}")
    else:
      print(text + "\n")


if __name__ == "__main__":
  main()
