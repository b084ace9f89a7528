"""The generated tables of the README and of docs/results/README.md, from the published records.

  python scripts/readme_tables.py            # print them
  python scripts/readme_tables.py --update   # rewrite them between their markers

README.md holds one headline table: each claim with its factor, its 95% interval, what it is read against
and the tuning runs that anchor was given, and its record. docs/results/README.md holds the fairness
ladder's and the speedrun recipe's tables over every published scale. Every cell comes from
`docs/results/<kind>/<kind>-<preset>.json`, which `python -m experiments.benchmark
--config=experiments/configs/benchmark.py:<preset> --config.benchmark.study=<kind>
--config.benchmark.publish=docs/results/<kind>` writes (with every figure per seed in <kind>-<preset>.md),
or from the optimizers study's records (docs/results/optimizers/). tests/test_docs.py checks that the
tables are this script's output and tests/bench/studies/test_ladder.py that every figure in the files
recomputes from their runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys

import scipy.stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RESULTS_PAGE = os.path.join(ROOT, "docs", "results", "README.md")  # the ladder's and the recipe's tables
ORDER = ("deep", "long", "tiny")  # the headline scale first

sys.path.insert(0, ROOT)
from hybridjax.bench import cells  # noqa: E402
from hybridjax.bench.comparison import cell_of  # noqa: E402
from hybridjax.bench.studies.ladder import report as ladder_report  # noqa: E402
from hybridjax.bench.studies.ladder.rungs import VERDICT  # noqa: E402
from hybridjax.bench.studies.optimizers.config import STUDY_CELLS  # noqa: E402
from hybridjax.bench.studies.recipe import report as recipe_report  # noqa: E402

# kind -> (the table over every scale, one scale's line, what its per-seed report holds)
KINDS = {
  "ladder": (ladder_report.ladder_table, ladder_report.ladder_scale, "every figure, per seed"),
  "recipe": (recipe_report.recipe_table, recipe_report.recipe_scale, "every step, per seed"),
}
# The headline table's rows beyond the ladder's verdict rungs: the recipe's scales, then the optimizers
# study's cells (each read against the cell its `Cell.against` names).
HEADLINE_RECIPES = ("long", "deep")
HEADLINE_CELLS = ("both_tuned", "small_batch", "corpus")
# What each ladder arm is, in the headline's words (an arm not named here shows its name).
ARM_NAMES = {
  "hybrid": "the velocity predictor",
  "jump": "the jump",
  "outer_momentum": "outer momentum",
  "selective": "selective backprop",
  "jump_forecast": "the jump with its forecaster",
  "jump_outer": "the jump along outer momentum",
}
# What each verdict rung's anchor is (rungs.py builds them); its LR and averaging beta are tuned.
ANCHORS = {
  "R4": "GPT-2 with AdamW, cosine, averaged",
  "R5": "GPT-2 with Muon, cosine, averaged",
  "R6": "the speedrun recipe, averaged",
}
COMPUTED = "†"  # marks an interval this script computes from a record's per-seed values


def markers(kind: str) -> tuple[str, str]:
  """The lines that enclose `kind`'s table (in README.md for "headline", else in docs/results/README.md)."""
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
  """`kind`'s table over every published scale, then one line per scale on what it ran, its links relative
  to docs/results/. A recipe measured with an earlier trick list than the newest published one gets its
  line, not a column: its steps are other changes under the same names (docs/recipe.md)."""
  table, scale, link = KINDS[kind]
  newest = max((int(r.get("trick_list", 1)) for r in results.values()), default=1)
  columns = {p: r for p, r in results.items() if kind != "recipe" or int(r.get("trick_list", 1)) == newest}
  lines = [f"* {scale(r)}; [{link}]({kind}/{kind}-{p}.md)." for p, r in columns.items()]
  changed = "../recipe.md#what-changed-from-the-first-trick-list"
  lines += [
    f"* Before the fixes (trick list {r.get('trick_list', 1)}, [what changed]({changed})): "
    f"{scale(r)}; [{link}]({kind}/{kind}-{p}.md)."
    for p, r in results.items()
    if p not in columns
  ]
  return table(list(columns.values())) + "\n\n" + "\n".join(lines)


def t_interval(values: list[float], where: str) -> tuple[float, float]:
  """The 95% t interval (n - 1 df) of the mean of per-seed values, for the records that publish mean ± sd
  and read their factors on the ratio scale (the ladder's pass ratios, the recipe's speed-ups).

  Raises:
    ValueError: with fewer than 2 values (`where` names the figure).
  """
  if len(values) < 2:
    raise ValueError(f"{where}: a t interval needs at least 2 seeds' values, got {len(values)}")
  half = float(scipy.stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
  mean = statistics.fmean(values)
  return mean - half, mean + half


def anchor_tuning_runs(grid: list[float]) -> int:
  """The runs `tuning.tune` spends on an anchor whose LR sweep ended on `grid`: the sweep on the first tuning
  seed, the best two LRs on the second, and the best LR with its two √2 neighbours at 0.5N and 2N (the
  count each family's benchmark.json lists in `tuning.rows`; tests/test_docs.py checks it there)."""
  return len(grid) + 2 + 3 * 2


def _factor(mean: float, lo: float, hi: float, mark: str = "") -> str:
  return f"{mean:.2f}× [{lo:.2f}, {hi:.2f}]{mark}"


def _unbounded(s: dict, where: str) -> list[float]:
  """A figure's per-seed values, refusing one whose seeds include a bound or a seed with no reading: its
  interval would not be one."""
  if s.get("n_null") or s.get("n_lower_bound") or s.get("n_upper_bound"):
    raise ValueError(f"{where}: a seed's reading is a bound or missing; its interval cannot be computed")
  return list(s["values"] if "values" in s else s["per_seed"])


def ladder_rows(ladder: dict) -> tuple[list[str], list[str]]:
  """The ladder's first question at each verdict rung: its best arm by pass ratio, with the rung's verdict on
  it; and a note for each arm whose verdict is "pays" (with whether its method was exercised)."""
  rows, notes = [], []
  for name in (r for r in VERDICT if r in ladder["rungs"]):
    rung = ladder["rungs"][name]
    group = ladder["groups"][rung["group"]]
    arms = rung["figures"]
    best = max(arms, key=lambda m: arms[m]["pass_ratio"]["mean"])
    f = arms[best]
    lo, hi = t_interval(_unbounded(f["pass_ratio"], f"{name} {best}"), f"{name} {best}")
    verdict = f["verdict"]
    word = {"no difference": f"no different from {name}"}.get(verdict["verdict"], verdict["verdict"])
    rows.append(
      f"| A method against {name} at `{ladder['preset']}`: the best of its {len(arms)} arms, "
      f"{ARM_NAMES.get(best, best)}, {word} (p {verdict['paired']['p']:.2g}) | "
      f"{_factor(f['pass_ratio']['mean'], lo, hi, COMPUTED)} in passes | {name}: {ANCHORS[name]}; its LR and "
      f"averaging β tuned ({anchor_tuning_runs(group['tuning']['grid'])} runs) | "
      f"[ladder-{ladder['preset']}](docs/results/ladder/ladder-{ladder['preset']}.md) |"
    )
    for m, g in arms.items():
      if g["verdict"]["verdict"] == "pays":
        mark = cells.exercise_mark(g)
        why = f", {mark}: the comparison tested nothing of its jumps" if mark else ""
        notes.append(f"At {name}, `{m}` pays ({g['pass_ratio']['mean']:.2f}× in passes){why}.")
  return rows, notes


def recipe_row(recipe: dict) -> str:
  """The whole recipe at one scale, read on its R4 anchor's averaged curve seed by seed."""
  total, preset = recipe["total_speedup"], recipe["preset"]
  lo, hi = t_interval(_unbounded(total, f"recipe {preset}"), f"recipe {preset}")
  return (
    f"| The speedrun recipe, whole, at `{preset}` ({total['wallclock_ratio']['mean']:.2f}× in wall-clock on "
    f"this CPU) | {_factor(total['mean'], lo, hi, COMPUTED)} in steps | R4 at `{preset}`, read on each seed's "
    f"curve; its LR and averaging β tuned ({anchor_tuning_runs(recipe['anchor']['grid'])} runs) | "
    f"[recipe-{preset}](docs/results/recipe/recipe-{preset}.md) |"
  )


def cell_row(record: dict, name: str) -> str:
  """Muon over AdamW in one cell of the optimizers study: reading (a), each side on its own curve."""
  a = record["factor"]["a"]
  sides = record["sides"]
  adamw, muon = (f"{sides[s]['tuning_runs']:g}" for s in ("adamw", "muon"))
  cell = cell_of(STUDY_CELLS, name)
  against, what = cell.against, cell.what
  if sides["adamw"].get("search"):
    tuned = f"searched jointly ({adamw} runs; Muon {muon})"
  else:
    tuned = f"`{against}`'s settings, then checked locally ({adamw} more runs; Muon {muon})"
  row = record["config"]["benchmark"]["optimizers"]["adamw_row"]
  preset = record["preset"]
  link = f"optimizers-{name}-{preset}" if name != "as_published" else f"optimizers-{preset}"
  return (
    f"| Muon over AdamW at `{preset}`: {what} | {_factor(a['mean'], *a['ci95'])} in steps | AdamW at "
    f"the recipe's `{row}` step, each side on its own curve; {tuned} | [{link}](docs/results/optimizers/{link}.md) |"
  )


def headline(ladder: dict, recipes: dict[str, dict], records: dict[str, dict]) -> str:
  """README's headline table (the ladder's verdict rungs at `ladder`'s scale, the whole recipe at each of
  `HEADLINE_RECIPES`, each optimizers cell of `HEADLINE_CELLS` in `records`), then what its marks mean."""
  rows, notes = ladder_rows(ladder)
  rows += [recipe_row(recipes[p]) for p in HEADLINE_RECIPES]
  rows += [cell_row(records[c], c) for c in HEADLINE_CELLS]
  seeds = len(ladder["rungs"][VERDICT[0]]["seeds"])
  table = ["| claim | factor [95% interval] | read against: how that anchor was tuned | record |", "|---|---|---|---|"]
  words = (
    f"{COMPUTED} Computed here from the record's {seeds} per-seed values, which it gives as mean ± sd: a t "
    "interval of the seeds' spread alone, where a verdict counts the eval set's error too. In passes: the "
    "anchor's steps to reach the arm's loss, over the arm's forward and backward passes; in steps: the "
    "anchor's steps to reach the loss at N, over N. " + " ".join(notes)
  )
  return "\n".join(table + rows) + "\n\n" + words.strip()


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


def load_cells() -> dict[str, dict]:
  """{cell name: its record at `long`} of the optimizers study's published cells."""
  out = {}
  for path in glob.glob(os.path.join(ROOT, "docs", "results", "optimizers", "optimizers-*.json")):
    with open(path) as f:
      result = json.load(f)
    if result["preset"] == "long":
      out[result["cell"]["name"]] = result
  return out


def generated() -> dict[str, tuple[str, str]]:
  """{kind: (the page it is written into, its text)} of every table this script writes."""
  out = {kind: (RESULTS_PAGE, tables(kind, load(kind))) for kind in KINDS}
  out["headline"] = (README, headline(load("ladder")["long"], load("recipe"), load_cells()))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--update", action="store_true", help="rewrite the tables between their markers")
  args = parser.parse_args()
  for kind, (page, text) in generated().items():
    if args.update:
      replace_between_markers(page, *markers(kind), text)
      print(f"updated {kind} table in {page}")
    else:
      print(text + "\n")


if __name__ == "__main__":
  main()
