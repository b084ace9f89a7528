"""The blocks a comparison study is built from, written once: a cell (a condition its sides are compared
under), a side (a config, the settings it is read at and the budgets its curve runs), the searches that
move a side (each budget's LR and weight decay re-checked; the joint search at equal cost), the checks of
its budgets and seeds, the readings (each side on its own budget curve), a side's record and the page
parts every comparison page shares. A study composes them and keeps only what is its own."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from hybridjax import codehash, schema
from hybridjax import data as data_lib
from hybridjax.bench import factor, figures, protocol, search, specs, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import FINALS, Config, Record, kept
from hybridjax.bench.tasks import task_path


@dataclasses.dataclass(frozen=True)
class Cell:
  """One cell of a study: a condition its sides are compared under.

  Attributes:
    name: its value of the study's `cell` field.
    what: what it changes from the cell it is read against (the summary page's words).
    against: the cell its factor is read against (`factor.cell_change`); '' for none.
    tuner: the `benchmark.tuner` it reads: 'lr' (it searches nothing) or 'joint' (`bench.search`).
    carries: the cell whose chosen settings it carries to its own condition ('' for none).
    condition: (config) -> the config it trains, from the config given (None: as given).
    checks: (config, its largest budget x N, its record's name) -> a line for each refusal of its own.
  """

  name: str
  what: str
  against: str = ""
  tuner: str = "lr"
  carries: str = ""
  condition: Callable[[Config], Config] | None = None
  checks: Callable[[Config, float, str], list[str]] | None = None


def cell_of(cells: tuple[Cell, ...], name: str) -> Cell:
  """The cell named `name` (the block's check has refused any other)."""
  return next(c for c in cells if c.name == str(name))


def tuner_errors(cell: Cell, config: Config) -> list[str]:
  """The line refusing a `benchmark.tuner` other than the one `cell` reads."""
  tuner = str(config.benchmark.get("tuner", "lr"))
  if tuner == cell.tuner:
    return []
  why = "(it searches nothing)" if cell.tuner == "lr" else "(both sides searched alike)"
  return [
    f"--config.benchmark.tuner={tuner!r}: cell {cell.name!r} reads tuner {cell.tuner!r} {why}; set "
    f"--config.benchmark.tuner={cell.tuner}"
  ]


def only_in(*cells: str) -> schema.Unread:
  """The `schema.Field.unread` of a field of a study's block that only its `cells` read."""

  def unread(config: Config) -> str | None:
    block = f"benchmark.{config.benchmark.study}"
    cell = str(config[block].cell)
    return (
      None
      if cell in cells
      else f"cell {cell!r} does not read it (only {', '.join(map(repr, cells))}); set --config.{block}.cell"
    )

  return unread


def seed_errors(block: str, o: Config) -> list[str]:
  """A comparison's seeds, `benchmark.<block>`'s: headline `seeds` and `plateau_seeds`, `tuning_seeds`
  and the joint search's `search_seeds` and `spare_seed`. Nothing is tuned on a headline seed."""
  seeds, plateau, tuning_seeds = ([int(s) for s in o[k]] for k in ("seeds", "plateau_seeds", "tuning_seeds"))
  headline, prefix, errors = set(seeds + plateau), f"--config.benchmark.{block}", []
  drawn = [int(s) for s in o.search_seeds] + [int(o.spare_seed)]
  if len(set(drawn)) != 4 or len(drawn) != 4 or set(drawn) & headline:
    errors.append(
      f"{prefix}.search_seeds={tuple(o.search_seeds)} and spare_seed={o.spare_seed}: give three distinct search "
      "seeds and a fourth spare one, none a headline or plateau seed (nothing is tuned on a headline seed)"
    )
  if len(seeds) < 2:
    errors.append(f"{prefix}.seeds={tuple(seeds)}: the factor pairs at least 2 headline seeds")
  if len(tuning_seeds) < 2 or set(tuning_seeds) & headline:
    errors.append(
      f"{prefix}.tuning_seeds={tuple(tuning_seeds)}: give at least two (the budget checks judge by their paired "
      "noise), none a headline or plateau seed (nothing is tuned on a headline seed)"
    )
  if len(headline) != len(seeds + plateau):
    errors.append(f"{prefix}.plateau_seeds must differ from the headline seeds and each other")
  return errors


def budget_errors(block: str, side: str, o: Config, n: int, up: bool) -> list[str]:
  """`side`'s `<side>_budgets` (x N, N among them) and `<side>_extensions` in `benchmark.<block>`, added in
  turn above its largest budget (`up`) or below its smallest, each its own step count at N = `n`."""
  prefix, errors = f"--config.benchmark.{block}.{side}", []
  budgets, ext = [float(f) for f in o[f"{side}_budgets"]], [float(f) for f in o[f"{side}_extensions"]]
  if 1.0 not in budgets or budgets != sorted(set(budgets)) or min(budgets) <= 0:
    errors.append(
      f"{prefix}_budgets={tuple(budgets)}: give increasing factors of N, N (1.0) among them (both readings are "
      "made at N)"
    )
  way = 1 if up else -1
  if ext and (ext != sorted(ext, reverse=not up) or any((f - (max if up else min)(budgets)) * way <= 0 for f in ext)):
    where = "above the largest" if up else "below the smallest (and above 0)"
    errors.append(f"{prefix}_extensions={tuple(ext)}: give factors {where} of its budgets, in the order they are added")
  if not up and any(f <= 0 for f in ext):
    errors.append(f"{prefix}_extensions={tuple(ext)}: factors must be > 0")
  steps = [round(f * n) for f in budgets + ext]
  if len(set(steps)) != len(steps) or min(steps, default=1) < 1:
    errors.append(
      f"{prefix}_budgets and {side}_extensions give {steps} steps at N={n}: each budget must round to its own "
      "positive step count"
    )
  return errors


def loss_of(run: Record, settings: Record) -> float:
  """A run's loss as its side reads it: at its iterate, at its beta."""
  return tuning.iterate_loss(run, settings["iterate"], float(settings["beta"]))


def paired_reading(a: list[Record], a_read: Record, b: list[Record], b_read: Record) -> tuple[list, list, Record]:
  """(a's losses, b's losses, their paired difference a - b): the runs `a` and `b` (one per seed, paired
  by place), each side read at its iterate and beta (`*_read`: {"iterate", "beta", ...}), judged besides
  the seeds' with the eval error of `tuning.paired_eval_error` (where a side is read raw, the seeds'
  spread alone: the runs keep the averaged iterate's per-window losses only). Pure."""
  la, lb = ([tuning.iterate_loss(r, x["iterate"], x["beta"]) for r in runs] for runs, x in ((a, a_read), (b, b_read)))
  averaged = a_read["iterate"] == b_read["iterate"] == "averaged"
  se, windows = tuning.paired_eval_error(a, b, [x - y for x, y in zip(la, lb)], averaged)
  return la, lb, protocol.paired_difference(la, lb, se, eval_windows=windows)


KEPT = ("seed", "steps", "lr", *FINALS, "wide_eval", "key")  # what a side's record keeps of a run


@dataclasses.dataclass
class Side:
  """One side of a comparison: its config, the settings it is read at (lr, beta, iterate, weight_decay and
  where they came from), its budgets (x N), each budget's re-check, its runs, and what tuned it."""

  name: str
  config: Config
  settings: Record
  budgets: list[float]
  checks: dict[str, Record] = dataclasses.field(default_factory=dict)  # str(factor) -> its re-check
  runs: dict[str, Record] = dataclasses.field(default_factory=dict)  # "seed/steps" -> run
  search: Record | None = None  # the joint search's record
  local_check: Record | None = None  # a carried cell's local check

  def setting_at(self, f: float) -> dict[str, float]:
    """Its (lr, weight_decay) at budget `f`: its re-check's choice, else its own."""
    check = self.checks.get(str(float(f)))
    return dict(check["chosen"]) if check else {k: self.settings[k] for k in ("lr", "weight_decay")}

  def spec(self, at: dict[str, float], seed: int, steps: int, wide_eval: int = 0) -> dict:
    """An anchor run at (lr, weight_decay) `at`, read at its beta; `wide_eval`: its final eval's windows, as a
    multiple of the config's (0: none besides its own)."""
    c = search.apply_setting(self.config, {search.weight_decay_field(self.config): float(at["weight_decay"])})
    beta = float(self.settings["beta"])
    return specs.run_spec(
      c, kind="anchor", seed=seed, lr=float(at["lr"]), steps=steps, beta=beta, betas=[beta], wide_eval=wide_eval
    )

  def at(self, seed: int, steps: int) -> float:
    return loss_of(self.runs[f"{seed}/{steps}"], self.settings)

  def record(self, seeds: list[int], n: int) -> Record:
    """Its record: its settings, per-budget setting and re-checks, its runs, and its costs in N-run
    equivalents (their steps over N): tuning (the joint search's or the local check's), measurement (the
    re-checks'), the curve's."""
    budgets = sorted(self.budgets)
    return {
      "settings": self.settings,
      "budgets": budgets,
      "per_budget": {str(float(f)): self.setting_at(f) for f in budgets},
      "rechecks": self.checks,
      "tuning_runs": (self.search or self.local_check or {}).get("search_runs", 0.0),
      "search": self.search,
      **({"local_check": self.local_check} if self.local_check else {}),
      "measurement_runs": sum(c["steps"] * len(t["losses"]) for c in self.checks.values() for t in c["tried"]) / n,
      "curve_runs": sum(round(f * n) for f in self.budgets) * len(seeds) / n,
      "runs": {f"{s}/{round(f * n)}": kept(self.runs[f"{s}/{round(f * n)}"], KEPT) for s in seeds for f in budgets},
    }


def curves(sides: list[Side], n: int, seeds: list[int], runner: Runner, wide_eval: int, label: str) -> None:
  """Every side's runs on `seeds` at every budget, at the budget's setting (cached runs are read back)."""
  todo = [(side, s, f) for side in sides for s in seeds for f in side.budgets if f"{s}/{round(f * n)}" not in side.runs]
  if todo:
    run_specs = [side.spec(side.setting_at(f), s, round(f * n), wide_eval) for side, s, f in todo]
    for (side, s, f), r in zip(todo, runner.run(run_specs, label)):
      side.runs[f"{s}/{round(f * n)}"] = r


def spanned(config: Config, slow: Side, fast: Side, o: Config, runner: Runner, study: str) -> Record:
  """Both sides' curves on the headline seeds of `benchmark.<study>` (`o`), each budget but N re-checked on
  its tuning seeds, the plateau seeds added where the plateau rule flags an N-step run; then `slow`'s curve
  extended up (`<slow>_extensions`, in turn) until it lies below `fast`'s loss at N on every seed, and
  `fast`'s down until it reaches `slow`'s loss at N on every seed. Returns the seeds read, the plateau
  runs and the extensions added; nothing is read beyond the budgets run."""
  n, tuning_seeds = int(config.trainer.steps), [int(s) for s in o.tuning_seeds]
  sides, seeds = [slow, fast], [int(s) for s in o.seeds]

  def run() -> None:
    """Every budget but N of every side not yet re-checked: each candidate (`tuning.budget_candidates`) on the
    tuning seeds, in one batch, kept by `tuning.BUDGET_RULE`; then the curves on the seeds read so far."""
    todo = [
      (side, f, at)
      for side in sides
      for f in side.budgets
      if f != 1.0 and str(float(f)) not in side.checks
      for at in tuning.budget_candidates(float(side.settings["lr"]), float(side.settings["weight_decay"]), f)
    ]
    if todo:
      run_specs = [side.spec(at, s, round(f * n)) for side, f, at in todo for s in tuning_seeds]
      results = iter(runner.run(run_specs, f"{study}: per-budget re-checks (tuning seeds)"))
      for side, f, at in todo:
        check = side.checks.setdefault(str(float(f)), {"steps": round(f * n), "tried": []})
        check["tried"].append(at | {"losses": [loss_of(next(results), side.settings) for _ in tuning_seeds]})
      for check in (c for side in sides for c in side.checks.values() if c["tried"]):  # none: read from a record
        check |= tuning.budget_choice(check["tried"])
    curves(sides, n, seeds, runner, int(o.wide_eval), f"{study}: budget curves (headline seeds)")

  run()
  curves_at_n = {side.name: {str(s): side.runs[f"{s}/{n}"]["curve"] for s in seeds} for side in sides}
  flagged = figures.plateau_runs(curves_at_n, n, float(config.benchmark.plateau_margin))
  added = [int(s) for s in o.plateau_seeds]
  if flagged and added:
    print(f"--- plateau runs {flagged}; adding seeds {added} to both sides", flush=True)
    seeds = seeds + added
    run()
  shorts = (
    (slow, lambda: any(min(slow.at(s, round(f * n)) for f in slow.budgets) >= fast.at(s, n) for s in seeds)),
    (fast, lambda: any(fast.at(s, round(min(fast.budgets) * n)) <= slow.at(s, n) for s in seeds)),
  )
  extended = {slow.name: [], fast.name: []}
  for side, short in shorts:
    for f in [float(f) for f in o[f"{side.name}_extensions"]]:
      if not short():
        break
      print(f"--- {side.name}'s curve does not span the other side's loss at N on every seed; adding {f} N")
      side.budgets.append(f)
      extended[side.name].append(f)
      run()
  return {"seeds": seeds, "plateaus": {"runs": flagged, "seeds_added": added if flagged else []}, "extended": extended}


def searched(
  config: Config,
  configs: dict[str, tuple[Config, dict]],
  o,
  runner: Runner,
  floor: float = 0.0,
) -> tuple[dict[str, tuple[Config, dict]], dict[str, Record]]:
  """Every side searched alike from its published settings by the joint search (`search.search_both`, on the
  block `o`'s search seeds, at equal cost, at least `floor`): (each side's config and settings at the setting
  it chose, its published ones kept under 'published'; each side's search record). The search offers only LR
  warm-ups shorter than each side's shortest budget, its extensions included."""
  shortest = {
    side: round(min(float(f) for f in [*o[f"{side}_budgets"], *o[f"{side}_extensions"]]) * int(config.trainer.steps))
    for side in configs
  }
  searches = search.side_searches({side: c for side, (c, _) in configs.items()}, o, config, shortest)
  records = search.search_both(searches, int(o.search_configs), runner, floor)
  return {side: at_chosen(c, records[side]["chosen"], p["row"], p) for side, (c, p) in configs.items()}, records


def at_chosen(config: Config, chosen: Record, row: str, published: Record) -> tuple[Any, Record]:
  """A side's config and settings at the setting its search chose (`chosen`), its `published` ones kept."""
  tuned = search.apply_setting(config, chosen["fields"])
  return tuned, {
    "row": row,
    "lr": float(chosen["fields"]["optim.learning_rate"]),
    "beta": chosen["beta"],
    "iterate": chosen["iterate"],
    "weight_decay": search.weight_decay_of(tuned)[1],
    "published": published,
    "fields": chosen["fields"],
  }


def code_record(config: Config) -> Record:
  """The code and library versions a comparison's anchor runs ran on."""
  return {
    "code_version": keys.code_versions(config, []),
    "library_versions": codehash.library_versions([keys.RUNNER_MODULES["anchor"], task_path(specs.task_name(config))]),
  }


def corpus(config: Config, largest_steps: int) -> Record:
  """The corpus: its name, its training tokens, how many times the longest run draws them, and its content
  hash (`data.prepare_corpus`'s, over every document), by which another machine's copy is known to be it."""
  if specs.task_name(config) != "gpt2":
    return {"name": specs.task_name(config), "tokens": None, "max_epochs": None}
  d = config.data
  prepared = data_lib.prepare_corpus(
    str(d.path) or None, str(d.tokenizer), str(d.cache_dir) or None, float(d.val_fraction)
  )
  return {
    "name": str(d.path) or "shakespeare (bundled)",
    "tokens": prepared.n_train,
    "max_epochs": largest_steps * int(config.trainer.batch_size) * int(config.model.n_ctx) / prepared.n_train,
    "content_hash": prepared.meta["content_hash"],
  }


def corpus_name(corpus: Record) -> str:
  """A record's corpus as a page names it: a folder by its own name (the record keeps the path this machine
  read it from), the bundled one as the record names it."""
  name = str(corpus["name"])
  return os.path.basename(name.rstrip(os.sep)) if os.path.isabs(name) else name


def grouped(per_batch: list[float], groups: int) -> list[float]:
  """Per-batch eval losses read in `groups` groups of consecutive batches: a cell at a smaller batch scores
  the same windows in more batches, and reads them in the preset's groups (`cell['eval_groups']`)."""
  x = np.asarray(per_batch, dtype=np.float64)
  if groups <= 0 or x.size % groups:
    raise ValueError(f"{x.size} eval batches do not fall into {groups} equal groups")
  return [float(v) for v in x.reshape(groups, -1).mean(axis=1)]


def side_curves(result: Record, side: str, iterate: str | None = None) -> dict[str, Record]:
  """Per headline seed, a side's budget curve as `factor.curves_from` reads it: its budgets (steps), its
  losses and, where the side reads its averaged iterate (whose per-window losses the runs keep), each
  run's loss on each eval window (each group of windows, where the cell names `eval_groups`). `iterate`:
  'raw' reads every run's raw iterate instead of the side's."""
  rec, n = result["sides"][side], int(result["steps"])
  groups = result["cell"].get("eval_groups")
  settings = rec["settings"] if iterate is None else rec["settings"] | {"iterate": iterate}
  out = {}
  for s in result["seeds"]:
    runs = [rec["runs"][f"{s}/{round(float(f) * n)}"] for f in rec["budgets"]]
    windows = settings["iterate"] == "averaged" and all("final_averaged_per_batch" in r for r in runs)
    per_window = [r["final_averaged_per_batch"] for r in runs] if windows else None
    out[str(s)] = {
      "steps": [int(r["steps"]) for r in runs],
      "loss": [loss_of(r, settings) for r in runs],
      "per_window": [grouped(w, int(groups)) for w in per_window] if per_window and groups else per_window,
    }
  return out


def own_curves(result: Record, slow: str, fast: str, field: tuple[float, float] | None) -> Record:
  """`fast`'s factor over `slow`, each on its own curve: {"factor": both readings with their intervals
  (`factor.factor`), "verdict": reading (a)'s against the field's line (`factor.cell_verdict`),
  "factor_raw": the same readings of both sides' raw iterates, printed beside the chosen ones (None where
  both sides read their raw iterate already)}; a record of `readings` 2 or later adds "interpolated": both
  readings without the fit (`factor.interpolated`), and its verdict against 1.0x with the `field`'s range
  beside it (`factor.verdict_against_one`)."""

  def pair(iterate: str | None = None) -> list[Record]:
    return [side_curves(result, side, iterate) for side in (slow, fast)]

  def read(iterate: str | None) -> Record:
    return factor.factor(*pair(iterate), int(result["steps"]), int(result["draws"]), int(result["bootstrap_seed"]))

  f = read(None)
  raw = None if all(s["settings"]["iterate"] == "raw" for s in result["sides"].values()) else read("raw")
  out = {"factor": f, "verdict": factor.cell_verdict(f["a"]), "factor_raw": raw}
  if result.get("readings", 1) >= 2:
    out["interpolated"] = factor.interpolated(*pair(), int(result["steps"]))
    out["verdict_against_one"] = factor.verdict_against_one(f["a"], field)
    out["verdict"] = out["verdict_against_one"]["verdict"]
  return out


def on_anchor_curve(losses: list[float], seeds: list[Any], curves: Record, n: int, counts: bool = False) -> Record:
  """`losses` (one per seed in `seeds`) read on an anchor's curve: its steps to reach each on that seed's
  budget curve (`curves`: seed -> {steps, loss}), over N; the mean and std over the seeds that reach it,
  whether a seed lies below the curve's end (a lower bound) or above its start (an upper bound), and with
  `counts` how many. Pure: the tests recompute it from the records."""
  reaches = [
    protocol.steps_to_reach_at_n(curves[str(s)]["steps"], curves[str(s)]["loss"], x, n) for s, x in zip(seeds, losses)
  ]
  per_seed = [None if r.steps is None else r.steps / n for r in reaches]
  present = [x for x in per_seed if x is not None]
  mean, std = protocol.mean_std(present) if present else (None, None)
  lower, upper = [r.lower_bound for r in reaches], [r.upper_bound for r in reaches]
  out = {"mean": mean, "std": std, "per_seed": per_seed, "lower_bound": any(lower), "upper_bound": any(upper)}
  return out | ({"n_lower_bound": sum(lower), "n_upper_bound": sum(upper)} if counts else {})


def at_n(result: Record, before: Record, side: str, seeds: list[str]) -> Record:
  """`side`'s loss at N in record `result` minus its loss at N in record `before`, on `seeds`, judged by
  `protocol.paired_difference` with the eval windows' error of the seed-averaged difference where both kept
  the windows (read in the same groups)."""

  def losses(r: Record) -> list[tuple[float, Any]]:
    curves, n = side_curves(r, side), int(r["steps"])
    return [
      (c["loss"][k], c["per_window"] and c["per_window"][k])
      for c in (curves[s] for s in seeds)
      for k in [c["steps"].index(n)]
    ]

  (la, wa), (lb, wb) = (zip(*losses(r)) for r in (result, before))  # (losses, windows) per seed
  windows = None not in wa + wb
  eval_se = protocol.seed_averaged_window_se(wa, wb) if windows else None
  return protocol.paired_difference(la, lb, eval_se, eval_windows=len(wa[0]) if windows else None)


BOUND = {None: "", "lower": "≥ ", "upper": "≤ ", "both": "bounded both ways: "}


def reading_cell(r: Record) -> str:
  """A reading: its geometric mean (a bound marked), its printed 95% interval and which it is."""
  lo, hi = r["ci95"]
  return f"{BOUND[r['bound']]}{r['mean']:.2f}× [{lo:.2f}, {hi:.2f}] ({r['interval']} interval)"


def reading_row(label: str, r: Record) -> str:
  """A table row of one reading: its label, `reading_cell`, its per-seed factors."""
  return f"| {label} | {reading_cell(r)} | {', '.join(f'{x:.2f}' for x in r['per_seed'])} |"


def reading_lines(result: Record, a: str, b: str) -> list[str]:
  """Both readings' table (`a`, `b`: their labels; the raw iterates' below them, where read), each fitted and
  model-free, the verdict, and each side's row (`side_lines`)."""
  f, raw = result["factor"], result.get("factor_raw")
  out = ["| reading | factor [95%] | per seed |", "|---|---|---|", reading_row(a, f["a"]), reading_row(b, f["b"])]
  out += [reading_row(f"the raw iterates': ({k})", raw[k]) for k in ("a", "b") if raw]
  return out + interpolated_lines(result) + ["", verdict_line(result), ""] + side_lines(result)


def page_head(title: str, result: Record) -> list[str]:
  """A page's title and its command (where the record keeps one)."""
  return [f"# {title}", "", f"Command: `{result['command']}`" if result.get("command") else "", ""]


def verdict_line(result: Record) -> str:
  """The verdict: a record of today's readings against 1.0× (`factor.verdict_against_one`), with the field's
  range beside it; a published one as it was published, against 1.5×."""
  v = result.get("verdict_against_one")
  if not v:
    return f"Verdict against the field (reading (a)'s interval against 1.5×): **{result['verdict']}**."
  field = "No field figure is printed beside it: none is known at this comparison."
  if v.get("field"):
    low, high = v["field"]
    field = (
      f"Beside it, descriptively, the field's range {low:g}–{high:g}× (`field.json`): the interval is "
      f"{v['against_field']} it."
    )
  return (
    f"Verdict against 1.0× (reading (a)'s 95% interval; the line declared before any seed was read): "
    f"**{v['verdict']}**; the smallest factor these seeds could tell from 1.0× at {v['power']:.0%} power: "
    f"{v['detectable']:.2f}×. {field}"
  )


def interpolated_lines(result: Record) -> list[str]:
  """Each reading fitted and model-free side by side (`factor.interpolated`), where the record holds both."""
  inter = result.get("interpolated")
  if not inter:
    return []
  out = ["", "| reading | fitted [95%] | interpolated [95% t] |", "|---|---|---|"]
  for name in ("a", "b"):
    i = inter[name]
    shown = f"{BOUND[i['bound']]}{i['mean']:.2f}× [{i['ci95_t'][0]:.2f}, {i['ci95_t'][1]:.2f}]"
    out.append(f"| ({name}) | {reading_cell(result['factor'][name])} | {shown} |")
  return out


def side_lines(result: Record) -> list[str]:
  """Each side's row, LR, beta and iterate, budgets, the budgets whose re-check moved its setting, and the
  re-checks' cost."""
  out = ["| side | row | LR | beta (iterate) | budgets (× N) | per-budget settings | re-check runs (N-run eq.) |"]
  out += ["|---|---|---|---|---|---|---|"]
  for side, rec in result["sides"].items():
    s = rec["settings"]
    moved = {k: v for k, v in rec["per_budget"].items() if v != {"lr": s["lr"], "weight_decay": s["weight_decay"]}}
    out.append(
      f"| {side} | {s['row']} | {s['lr']:.4g} | {s['beta']} ({s['iterate']}) | {rec['budgets']} | "
      f"{moved or 'as published'} | {rec['measurement_runs']:.1f} |"
    )
  return out


def curve_lines(result: Record) -> list[str]:
  """Each side's loss per budget on each seed, then the fitted curves."""
  out, n = ["", "| side | seed | loss per budget |", "|---|---|---|"], int(result["steps"])
  for side in result["sides"]:
    for s, c in side_curves(result, side).items():
      out.append(f"| {side} | {s} | {', '.join(f'{t / n:.3g} N: {x:.4f}' for t, x in zip(c['steps'], c['loss']))} |")
  fits = "; ".join(  # `factor.factor` names the slow side's fit 'adamw' and the fast one's 'muon'
    f"{k} a = {v['a']:.4f}, b = {v['b']:.4f}, c = {v['c']:.3f}"
    for k, v in zip(result["sides"], result["factor"]["fits"].values())
  )
  return out + ["", f"Fits: {fits}."]


def tuned_minus_published(rec: Record) -> Record:
  """The fields a side's search moved from its published setting: {field: [published, tuned]}."""
  settings, search = rec["settings"], rec["search"]
  published = next(s["config"] for s in search["settings"] if s["origin"] == "published")
  fields = settings["fields"]
  moved = {k: [published.get(k), fields.get(k)] for k in {**published, **fields} if published.get(k) != fields.get(k)}
  for k in ("beta", "iterate"):
    if settings["published"][k] != settings[k]:
      moved[k] = [settings["published"][k], settings[k]]
  return moved


def search_lines(result: Record) -> list[str]:
  """The searched sides (cell `both_tuned`'s): each side's search cost (N-run equivalents) and what it moved."""
  searched = {side: rec for side, rec in result["sides"].items() if rec.get("search")}
  if not searched:
    return []
  out = ["", "| side | search runs (N-run eq.) | Sobol points | tuned − published |", "|---|---|---|---|"]
  for side, rec in searched.items():
    moved = ", ".join(f"{k}: {a} → {b}" for k, (a, b) in tuned_minus_published(rec).items()) or "nothing"
    out.append(f"| {side} | {rec['tuning_runs']:.1f} | {rec['search']['sobol_points']} | {moved} |")
  return out
