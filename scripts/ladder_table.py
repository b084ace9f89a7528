"""The README's headline: the fairness ladder's tables, generated from the published ladder runs.

  python scripts/ladder_table.py            # print the tables
  python scripts/ladder_table.py --update   # rewrite them in README.md (between the markers)

Every cell comes from `docs/results/ladder/ladder-<preset>.json`, which
`python -m experiments.benchmark --config=experiments/configs/benchmark.py:<preset>
--config.benchmark.ladder=True --config.benchmark.publish=docs/results/ladder` writes (with the full
per-rung tables in ladder-<preset>.md); tests/test_docs.py checks that the README's tables are this
script's output and tests/bench/test_ladder.py that every figure in the files recomputes from their runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(ROOT, "docs", "results", "ladder")
README = os.path.join(ROOT, "README.md")
START, END = "<!-- ladder-table:start -->", "<!-- ladder-table:end -->"
ORDER = ("long", "tiny")  # the headline scale first

sys.path.insert(0, ROOT)
from hybridjax.bench import report  # noqa: E402


def load() -> dict[str, dict]:
  """{preset: parsed ladder-<preset>.json} of every published ladder, headline scale first."""
  out = {}
  for path in glob.glob(os.path.join(LADDER, "ladder-*.json")):
    with open(path) as f:
      result = json.load(f)
    out[result["preset"]] = result
  return dict(sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def tables(results: dict[str, dict]) -> str:
  """The headline table over every published scale, then one line per scale on what it ran."""
  scales = "\n".join(
    f"* {report.ladder_scale(r)}; [every figure, per seed](docs/results/ladder/ladder-{p}.md)."
    for p, r in results.items()
  )
  return report.ladder_table(list(results.values())) + "\n\n" + scales


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--update", action="store_true", help="rewrite the tables in README.md")
  args = parser.parse_args()
  text = tables(load())
  if not args.update:
    print(text)
    return
  report.replace_between_markers(README, START, END, text)
  print(f"updated {README}")


if __name__ == "__main__":
  main()
