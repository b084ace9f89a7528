"""The joint tuner's curves: once R4 and the whole recipe are searched alike, each side's budget curve on
the headline seeds at the setting its search chose (its re-checks and extensions by `comparison.spanned`),
read on each side's own curve (`comparison.own_curves`: reading (a), the jointly searched R4's steps to
reach the recipe's loss at N, is the primary one); the same at each side's raw-chosen setting, read raw;
and rows read on R4's curve: R4 as the recipe record tuned it (LR and averaging beta), and cell
`both_tuned`'s AdamW and Muon sides from their record (`benchmark.knobs.rows_from`)."""

from __future__ import annotations

import json
import os

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import comparison, factor, timing
from hybridjax.bench import record as record_lib
from hybridjax.bench.comparison import Side
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import Config, Record, curves_record, tuner

PAIR = ("anchor", "recipe")  # the slow side (R4, whose curve the rows are read on) and the fast one
ROWS = ("adamw", "muon")  # cell `both_tuned`'s sides, read on R4's curve
ITERATES = {"primary": "chosen", "raw": "raw_chosen"}  # a pair of curves -> the search's setting it runs
QUIET_LOAD = 2.5  # a 1-minute load average above it after the timing: another job ran beside it; timed again once


def reads_curves(config: Config) -> bool:
  """Whether the study runs the curves: the joint tuner with R4 and the whole recipe among its sides."""
  return tuner(config) == "joint" and all(s in arms_lib.names(config.benchmark.knobs.sides) for s in PAIR)


def block(config: Config) -> Config:
  """`benchmark.knobs` as `comparison.spanned` reads a study's block: the headline seeds the benchmark's, the
  re-checks on the search's seeds."""
  k = config.benchmark.knobs
  seeds = {"seeds": tuple(config.benchmark.seeds), "tuning_seeds": tuple(k.search_seeds)}
  return Config(k.to_dict() | seeds)


def rows_record(config: Config) -> tuple[str, Record | None]:
  """(its path, the record) of the cell `both_tuned` record whose sides are read on R4's curve
  (`knobs.rows_from`; '': the published one at this preset, None where this preset has none). A missing one
  given, or one of another cell or N, is refused naming the field."""
  field = "--config.benchmark.knobs.rows_from"
  path, rows = record_lib.both_tuned_record(config, "knobs.rows_from", "the optimizers study's cell both_tuned", False)
  if rows is not None and (
    rows.get("cell", {}).get("name") != "both_tuned" or int(rows["steps"]) != int(config.trainer.steps)
  ):
    raise ValueError(
      f"{field}={path}: a record of cell {rows.get('cell', {}).get('name')!r} at N = {rows.get('steps')}; the rows "
      f"are read on R4's curve at N = {int(config.trainer.steps)}: give a cell 'both_tuned' record at this preset"
    )
  return path, rows


def searched_from(config: Config) -> dict[str, Record]:
  """{side: its search's record} from the knobs-joint record `knobs.search_from`: a search finished at an
  earlier commit, taken as it chose rather than run again (its runs keyed to that commit's code). A missing
  record, or one of another tuner, preset, N or sides, is refused naming the field."""
  path, field = str(config.benchmark.knobs.search_from), "--config.benchmark.knobs.search_from"
  if not os.path.exists(path):
    raise ValueError(
      f"{field}={path}: no such record: give the knobs-joint-<preset>.json a joint search wrote in its workdir "
      "(at long, the published one: docs/results/recipe/joint-long-search-record.json)"
    )
  with open(path) as f:
    rec = json.load(f)
  wanted = arms_lib.names(config.benchmark.knobs.sides)
  same = (rec.get("tuner"), rec.get("preset"), rec.get("steps"), sorted(rec.get("sides", {})))
  if same != ("joint", str(config.benchmark.preset), int(config.trainer.steps), sorted(wanted)):
    raise ValueError(
      f"{field}={path}: a record of tuner {same[0]!r}, preset {same[1]!r}, N = {same[2]}, sides {same[3]}; this run "
      f"is the joint tuner at {config.benchmark.preset!r}, N = {int(config.trainer.steps)}, sides {sorted(wanted)}: "
      "give a knobs-joint record of this run's preset and sides"
    )
  return {side: rec["sides"][side]["search"] for side in wanted}


def sides_at(config: Config, sides: Record, state: Record, which: str) -> list[Side] | None:
  """R4 and the whole recipe as comparison sides at the setting their searches chose for `which` iterate
  ('primary': the search's choice; 'raw': its raw-chosen setting, read raw); None where a search has none."""
  k, out = config.benchmark.knobs, []
  for name in PAIR:
    c, published = sides[name]
    chosen = state[name]["search"].get(ITERATES[which])
    if chosen is None:
      return None
    tuned, settings = comparison.at_chosen(c, chosen, name, published)
    out.append(Side(name, tuned, settings, [float(f) for f in k[f"{name}_budgets"]], search=state[name]["search"]))
  return out


def train(config: Config, sides: Record, state: Record, runner: Runner) -> Record:
  """Both pairs' curves (the primary and the raw one): {which: {"sides", "seeds", "plateaus", "extended"}},
  a pair left out where a search chose no setting for it."""
  out = {}
  for which in ITERATES:
    pair = sides_at(config, sides, state, which)
    if pair:
      out[which] = {"sides": pair} | comparison.spanned(config, *pair, block(config), runner, f"knobs ({which})")
  return out


def time_steps(config: Config, trained: Record) -> Record:
  """R4's and the whole recipe's time per step at their primary settings, interleaved in one process
  (`timing.time_baselines`), with the machine's 1-minute load average after it; timed again once where that
  was above `QUIET_LOAD`. {} without the curves."""
  pair = trained.get("curves", {}).get("primary")
  if not pair:
    return {}
  entries = {s.name: (s.config, float(s.settings["lr"]), float(s.settings["beta"])) for s in pair["sides"]}
  for _ in range(2):
    timed = timing.time_baselines(entries) | {"load_average_1m": os.getloadavg()[0]}
    if timed["load_average_1m"] <= QUIET_LOAD:
      break
  return timed


def in_seconds(reading: Record, timed: Record) -> Record:
  """Reading (a) in seconds, this CPU at this size: the steps factor (its mean and interval) times R4's time
  per step over the recipe's, from one interleaved timing (`time_steps`); the timing is not resampled."""
  ms = {side: timed["ms_per_step"][side] for side in PAIR}
  ratio = ms["anchor"] / ms["recipe"]
  return {
    "ms_per_step": ms,
    "step_time_ratio": ratio,
    "load_average_1m": timed["load_average_1m"],
    "mean": reading["mean"] * ratio,
    "ci95": [x * ratio for x in reading["ci95"]],
  }


def record(config: Config, curves: Record, published: Record, timed: Record | None = None) -> Record:
  """The curves' record: per pair, a comparison record (`comparison.own_curves`' readings of the recipe over
  R4, its verdict against 1.0x), and on the primary pair's R4 curve the rows: R4 as published (`published`: its
  headline runs' losses at N, model-free: `comparison.on_anchor_curve`) and cell `both_tuned`'s AdamW and Muon
  (their own curves: both readings, `factor.factor`)."""
  n, out = int(config.trainer.steps), {}
  for which, trained in curves.items():
    cell = {"name": f"joint-{which}", "eval_groups": int(config.trainer.eval_batches)}
    result = {"cell": cell} | curves_record(block(config), trained, n)
    out[which] = result | comparison.own_curves(result, *PAIR, None)
  if "primary" in out:
    if timed:
      out["primary"]["seconds"] = in_seconds(out["primary"]["factor"]["a"], timed)
    path, rows = rows_record(config)
    out["rows"] = {"rows_from": path} | (rows_on_r4(out["primary"], published, rows) if rows else {})
  return out


def rows_on_r4(primary: Record, published: Record, rows: Record) -> Record:
  """Each row read on the primary pair's R4 curve (pure: the tests recompute it from the record). R4 as
  published: its losses at N on the headline seeds (`published`: seed -> loss), model-free. Cell
  `both_tuned`'s sides: on the seeds both records hold, each on its own curve (`factor.factor`, R4 the slow
  side)."""
  r4, n = comparison.side_curves(primary, "anchor"), int(primary["steps"])
  seeds = [s for s in map(str, primary["seeds"]) if s in published]
  out = {"published": comparison.on_anchor_curve([published[s] for s in seeds], seeds, r4, n, counts=True)}
  for side in ROWS:
    theirs = comparison.side_curves(rows, side)
    common = [s for s in r4 if s in theirs]
    out[side] = factor.factor(
      {s: r4[s] for s in common}, {s: theirs[s] for s in common}, n, int(primary["draws"]), primary["bootstrap_seed"]
    )
  return out


def lines(result: Record) -> list[str]:
  """The curves' part of the knobs page: per pair, its readings, the verdict, its sides and curves; then the
  rows on R4's curve."""
  curves = result.get("curves")
  if not curves:
    return []
  out = []
  for which in ITERATES:
    if which not in curves:
      out += ["", f"No {which} pair: a search chose no setting for it."]
      continue
    r = curves[which]
    out += [
      "",
      f"## The whole recipe over R4, both searched alike, each on its own curve ({which} setting)",
      "",
      "Reading (a): the jointly searched R4's steps to reach the whole recipe's loss at N, over N (the primary "
      "reading, declared before any headline seed ran); reading (b): N over the recipe's steps to reach R4's loss "
      f"at N. Headline seeds {r['seeds']}; re-checks on {r['tuning_seeds']}.",
      "",
    ]
    a, b = "(a) R4's steps to the recipe's loss at N / N", "(b) N / the recipe's steps to R4's"
    out += comparison.reading_lines(r, a, b) + comparison.curve_lines(r)
    if r.get("seconds"):
      sec = r["seconds"]
      out += [
        "",
        f"In seconds, this CPU at this size (not a headline): reading (a) times R4's time per step over the "
        f"recipe's ({sec['ms_per_step']['anchor']:.1f} ms / {sec['ms_per_step']['recipe']:.1f} ms = "
        f"{sec['step_time_ratio']:.2f}, timed interleaved at a 1-minute load average of "
        f"{sec['load_average_1m']:.1f}): {sec['mean']:.2f}× [{sec['ci95'][0]:.2f}, {sec['ci95'][1]:.2f}].",
      ]
  rows = curves.get("rows")
  if rows and "published" not in rows:
    out += ["", f"No rows read on R4's curve: no cell `both_tuned` record at {os.path.basename(rows['rows_from'])}."]
  elif rows:
    p = rows["published"]
    shown = "not reached" if p["mean"] is None else f"{p['mean']:.2f}× ± {p['std']:.2f} sd (model-free)"
    out += [
      "",
      "## Rows read on the jointly searched R4's curve (primary setting)",
      "",
      f"Cell `both_tuned`'s sides from {os.path.basename(rows['rows_from'])}.",
      "",
      "| row | (a) R4's steps to its loss at N / N [95%] | (b) N / its steps to R4's [95%] |",
      "|---|---|---|",
      f"| R4 as the recipe record tuned it (LR, averaging β) | {shown} | |",
    ]
    out += [
      f"| cell `both_tuned`'s {side} | {comparison.reading_cell(rows[side]['a'])} | "
      f"{comparison.reading_cell(rows[side]['b'])} |"
      for side in ROWS
    ]
  return out
