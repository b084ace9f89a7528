"""Reshapes a variants record written by the study's first reader (one LR per pair, each side's runs
as a list) into today's record (each side's settings, runs by seed, the table's resolution), keeping
every run's numbers as they are: every figure recomputes from them as it was printed (its verdict under
the rule it was printed by, `protocol.rule_of`), and the reshaped record holds today's figures.

  python scripts/reshape_variants.py docs/results/recipe/variants-fixes-long.as-written.json \
      docs/results/recipe/variants-fixes-long.json

It writes the reshaped json and its markdown; the tests check that the published record is this
script's reshaping of the record as written.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hybridjax.bench import protocol, tuning  # noqa: E402
from hybridjax.bench.studies.variants import report, run  # noqa: E402
from hybridjax.bench.studies.variants.sets import SETS  # noqa: E402

NOTE = (
  "written by the study's first reader (one LR per pair, each side's runs as a list: "
  "variants-fixes-long.as-written.json); reshaped to today's record (each side's settings, runs by seed, the "
  "table's resolution) by scripts/reshape_variants.py, with the same runs: every figure recomputes as printed"
)


def reshape(written: dict[str, Any]) -> dict[str, Any]:
  """Today's record of a record as the first reader wrote it."""
  if "resolution" in written:
    raise ValueError("this record already has today's shape")
  r = copy.deepcopy(written)
  pairs = {p.name: p for p in SETS[r["set"]].pairs}
  for p in r["pairs"]:
    settings = p.pop("settings")
    runs = p.pop("runs")
    sides = {
      side: {
        "settings": dict(settings),
        "runs": {str(x["seed"]): {k: v for k, v in x.items() if k != "seed"} for x in runs[side]},
      }
      for side in ("before", "after")
    }
    figures = run.pair_figures(sides["before"], sides["after"])
    if any(figures[k] != p[k] for k in ("before", "after")) or printed_difference(sides, p) != p["difference"]:
      raise ValueError(f"pair {p['name']!r}: its runs do not give the figures it printed")
    p.update(rule=pairs[p["name"]].rule, drop=list(pairs[p["name"]].drop))
    p["settings"] = {side: sides[side]["settings"] for side in sides}
    p.update(figures)
    p["runs"] = {side: sides[side]["runs"] for side in sides}
  r.update(tuned=False, seeds_added={}, reshaped=NOTE)
  r["resolution"] = run.resolution(r["pairs"])
  return r


def printed_difference(sides: dict[str, Any], printed: dict[str, Any]) -> dict[str, Any]:
  """A pair's difference as its first reader computed it from the runs: judged with the mean over the
  seeds of the runs' paired per-batch error, by the rule the printed difference was judged by, in the
  printed record's keys."""
  seeds = sorted(set(sides["before"]["runs"]) & set(sides["after"]["runs"]), key=int)
  averaged = all(side["settings"]["iterate"] == "averaged" for side in sides.values())
  ses = [tuning.paired_batch_se_of(sides["after"]["runs"][s], sides["before"]["runs"][s]) for s in seeds]
  ses = ses if averaged else [None]  # the runs keep the averaged iterate's per-batch losses only
  eval_se = sum(ses) / len(ses) if ses and None not in ses else None
  d = printed["difference"]
  again = protocol.paired_difference(printed["after"], printed["before"], eval_se, rule=protocol.rule_of(d))
  return {k: again[k] for k in d if k in again}


def main(argv: list[str]) -> None:
  src, dst = argv
  with open(src) as f:
    result = reshape(json.load(f))
  with open(dst, "w") as f:
    json.dump(result, f, indent=1)
  with open(dst.replace(".json", ".md"), "w") as f:
    f.write(report.markdown(result) + "\n")
  print(f"wrote {dst} and its markdown")


if __name__ == "__main__":
  main(sys.argv[1:])
