"""Cell `sides`: any optimizer against the reference AdamW, in one command (docs/benchmark.md). Each side of
`benchmark.optimizers.sides` is a built-in optimizer by name or a user's module by dotted path
(`optimizers.module`), moved from the reference's config to its space's centre (`search.centred`); every
side and the reference are searched alike at equal cost (`comparison.searched`), or the reference is read
from a cell `both_tuned` record (`reference_from`) and the sides spend what its search spent; then each
side's curve and the reference's run and are extended until each spans the other's loss at N
(`comparison.spanned`), and read each on its own curve (`comparison.own_curves`). `table` gives, per side,
the plain dict `judge` returns; its verdicts are against 1.0x, Holm-adjusted across the sides."""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import statistics

import jax

from hybridjax import optim as optim_lib
from hybridjax.bench import comparison, search, specs
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.comparison import Side
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import Config, Record
from hybridjax.optimizers import module as module_lib

REFERENCE = "adamw"  # the side every other is read against: the study's AdamW row
ALPHA = 0.05  # the family-wise error rate of the verdicts (Holm)


def names(o: Config) -> list[str]:
  """The optimizers of `sides` besides the reference, in order."""
  return [s for s in dict.fromkeys(x.strip() for x in str(o.sides).split(",")) if s and s != REFERENCE]


def label(name: str) -> str:
  """A side's name in the record and the block: a module's dotted path with '-' for '.'."""
  return name.replace(".", "-")


def errors(config: Config, reference: Config) -> list[str]:
  """The sides' refusals, each naming the fix, before anything trains: no side; a built-in with no space; a
  module that breaks `optimizers.module`'s interface, or that the schedule cannot drive (traced on the task's
  params, nothing computed)."""
  sides, field = names(config.benchmark.optimizers), "--config.benchmark.optimizers.sides"
  try:
    reference_record(config)
  except (ValueError, OSError, KeyError) as e:
    return [str(e)]
  if not sides:
    return [f"{field}={config.benchmark.optimizers.sides!r} names no optimizer besides {REFERENCE!r}: give e.g. lion"]
  out = []
  for name in sides:
    try:
      c = search.centred(reference, name)
    except ValueError as e:
      near = difflib.get_close_matches(name, list(optim_lib.OPTIMIZERS), n=1)
      out.append(f"{field}: {e}" + (f" (did you mean {near[0]!r}?)" if near else ""))
      continue
    if name in optim_lib.OPTIMIZERS:
      continue
    problems = module_lib.errors(name)
    if not problems:
      params = jax.eval_shape(tasks_lib.build(specs.task_name(config), c)["init_params"], jax.random.PRNGKey(0))
      problems = module_lib.schedule_errors(c.optim, optim_lib.resolve_optimizer(c.optim, params), params)
    out += [f"{field}: {p}" for p in problems]
  return out


def reference_record(config: Config) -> tuple[Record, str] | None:
  """(the cell `both_tuned` record `reference_from` names, its run cache: `<cell>-<preset>-run-cache` beside
  it), or None where the reference is searched again. Refused, naming the field: a record of another preset,
  N or headline seeds, or a run its cache lacks."""
  path, field = str(config.benchmark.optimizers.reference_from), "--config.benchmark.optimizers.reference_from"
  if not path:
    return None
  with open(path, encoding="utf-8") as f:
    rec = json.load(f)
  cache = os.path.join(os.path.dirname(path), f"{rec['cell']['name']}-{rec['preset']}-run-cache")
  o, side = config.benchmark.optimizers, rec["sides"][REFERENCE]
  same = (rec["preset"], int(rec["steps"])) == (str(config.benchmark.preset), int(config.trainer.steps))
  if not same or not {int(s) for s in o.seeds} <= {int(s) for s in rec["seeds"]}:
    raise ValueError(
      f"{field}={path!r} is a record at preset {rec['preset']!r}, N={rec['steps']}, seeds {rec['seeds']}: give one "
      f"at this preset and N whose seeds hold --config.benchmark.optimizers.seeds={tuple(o.seeds)}, or '' to search "
      "the reference again"
    )
  missing = [k for k, r in side["runs"].items() if not os.path.exists(os.path.join(cache, f"{r.get('key')}.json"))]
  if missing:
    raise ValueError(f"{field}={path!r}: its run cache {cache} lacks runs {missing[:3]}: commit or copy it there")
  return rec, cache


def from_record(reference: tuple, rec: Record, cache: str) -> Side:
  """The reference read from a cell `both_tuned` record, never re-run: its setting, budgets, re-checks, search
  and its runs as its run cache holds them (their eval curves too)."""
  side = rec["sides"][REFERENCE]
  runs = {}
  for k, r in side["runs"].items():
    with open(os.path.join(cache, f"{r['key']}.json"), encoding="utf-8") as f:
      runs[k] = json.load(f)
  c = search.apply_setting(reference[0], side["settings"]["fields"])
  # every budget's setting as the record chose it: one it did not re-check is not re-checked here either
  checks = {
    f: side["rechecks"].get(f) or {"steps": round(float(f) * rec["steps"]), "tried": [], "chosen": at, "read": True}
    for f, at in side["per_budget"].items()
    if float(f) != 1.0
  }
  return Side(REFERENCE, c, side["settings"], list(side["budgets"]), checks, runs, side["search"])


def block(o: Config) -> Config:
  """The study block with each side's budgets: every side's curve (the reference's too) runs both rows'
  budgets, the reference extended up by `adamw_extensions`, a side down by `muon_extensions`."""
  out = Config(o.to_dict())
  budgets = sorted({float(f) for f in [*o.adamw_budgets, *o.muon_budgets]})
  out.adamw_budgets = budgets
  for name in names(o):
    out[f"{label(name)}_budgets"], out[f"{label(name)}_extensions"] = budgets, list(o.muon_extensions)
  return out


def train(config: Config, reference: tuple, runner: Runner) -> Record:
  """Every side searched alike with the reference, then each side's curve against the reference's."""
  o, read = block(config.benchmark.optimizers), reference_record(config)
  ref_config, ref_settings = reference
  configs = {} if read else {REFERENCE: reference}
  for name in names(o):
    c = search.centred(ref_config, name)
    settings = {"row": name, "lr": float(c.optim.learning_rate), "beta": ref_settings["beta"]}
    configs[label(name)] = (
      c,
      settings | {"iterate": ref_settings["iterate"], "weight_decay": search.weight_decay_of(c)[1]},
    )
  ref = from_record(reference, *read) if read else None
  configs, searches = comparison.searched(config, configs, o, runner, ref.search["search_runs"] if ref else 0.0)
  sides = {s: Side(s, *configs[s], list(o[f"{s}_budgets"]), search=searches[s]) for s in configs}
  sides = {REFERENCE: ref} | sides if ref else sides
  spans = {
    s: comparison.spanned(config, sides[REFERENCE], sides[s], o, runner, "optimizers") for s in sides if s != REFERENCE
  }
  seeds = sorted({x for span in spans.values() for x in span["seeds"]})
  comparison.curves([sides[REFERENCE]], int(config.trainer.steps), seeds, runner, int(o.wide_eval), "reference")
  return {"sides": sides, "spans": spans, "block": o}


def record(config: Config, trained: Record, field: tuple[float, float]) -> Record:
  """Each side's comparison with the reference (its readings, `comparison.own_curves`), and `table`."""
  n, o, ref = int(config.trainer.steps), trained["block"], trained["sides"][REFERENCE]
  pairs = {}
  for s, span in trained["spans"].items():
    pair = {
      "steps": n,
      "seeds": span["seeds"],
      "cell": {"eval_groups": int(config.trainer.eval_batches)},
      "draws": int(o.draws),
      "bootstrap_seed": int(o.bootstrap_seed),
      "readings": 2,
      "extended": span["extended"],
      "sides": {REFERENCE: ref.record(span["seeds"], n), s: trained["sides"][s].record(span["seeds"], n)},
      "step_s": {REFERENCE: _step_s(ref.runs), s: _step_s(trained["sides"][s].runs)},
    }
    pairs[s] = pair | comparison.own_curves(pair, REFERENCE, s, field)
  return {"pairs": pairs, "table": table(pairs)}


def _p_value(reading: Record) -> float:
  """The two-sided p-value of reading (a)'s log factor against 0 (1.0x), from its 95% interval (t, seeds - 1
  df): the interval's standard error, as `factor.detectable` reads it."""
  from scipy import stats

  df = len(reading["per_seed"]) - 1
  lo, hi = reading["ci95"]
  se = math.log(hi / lo) / (2 * float(stats.t.ppf(0.975, df)))
  return float(2 * stats.t.sf(abs(math.log(reading["mean"])) / se, df))


def holm(p: dict[str, float]) -> dict[str, float]:
  """Holm's step-down adjusted p-values: the k-th smallest of m times (m - k + 1), never below the one before."""
  out, running = {}, 0.0
  for k, (name, value) in enumerate(sorted(p.items(), key=lambda kv: kv[1])):
    running = max(running, min(1.0, (len(p) - k) * value))
    out[name] = running
  return out


def _reading(r: Record) -> Record:
  return {"factor": r["mean"], "ci95": list(r["ci95"]), "bound": r["bound"]}


def _step_s(runs: dict[str, Record]) -> float:
  """A side's median seconds a step over its curve's runs (their `train_s`; nan where none kept it)."""
  times = [r["train_s"] / r["steps"] for r in runs.values() if r.get("train_s")]
  return statistics.median(times) if times else math.nan


def table(pairs: dict[str, Record]) -> dict[str, Record]:
  """Per side against the reference, a plain dict: readings (a) and (b) at the side's iterate and at the raw
  iterate with their 95% intervals, the model-free ones beside, the step-time ratio, the verdict on (a) at the
  primary iterate against 1.0x after Holm across the sides, the smallest factor its seeds could tell from 1.0x,
  the headline seeds, the tuning runs spent (both sides'), the tuning-cost curve and the chosen setting."""
  adjusted = holm({s: _p_value(p["factor"]["a"]) for s, p in pairs.items()})
  out = {}
  for s, p in pairs.items():
    side, ref, f = p["sides"][s], p["sides"][REFERENCE], p["factor"]
    word = "above 1.0×" if f["a"]["mean"] > 1 else "below 1.0×"
    out[s.replace("-", ".")] = {
      "reference": REFERENCE,
      "primary": {k: _reading(f[k]) for k in ("a", "b")},
      "raw": {k: _reading(p["factor_raw"][k]) for k in ("a", "b")} if p["factor_raw"] else None,
      "model_free": {
        k: {"factor": v["mean"], "ci95": v["ci95_t"], "bound": v["bound"]}
        for k, v in p["interpolated"].items()
        if k in ("a", "b")
      },
      "step_time_ratio": p["step_s"][s] / p["step_s"][REFERENCE],
      "p_holm": adjusted[s],
      "verdict": word if adjusted[s] < ALPHA else "undetermined",
      "smallest_tellable": p["verdict_against_one"]["detectable"],
      "seeds": p["seeds"],
      "tuning_runs": side["tuning_runs"],
      "reference_tuning_runs": ref["tuning_runs"],
      "tuning_curve": side["search"]["tuning_curve"],
      "chosen": side["settings"]["fields"] | {"beta": side["settings"]["beta"], "iterate": side["settings"]["iterate"]},
      "reference_extended": p["extended"][REFERENCE],
    }
  return out


def markdown(result: Record) -> list[str]:
  """The table's page lines: a row per side; the knobs each lacks and where its space is centred."""
  out = [
    "| side | (a) [95%] | (b) [95%] | raw (a) | model-free (a) | step time | verdict (Holm) | tellable | tuning "
    "runs (ref) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  show = lambda r: f"{r['factor']:.2f}× [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"  # noqa: E731
  for name, row in result["table"].items():
    raw = show(row["raw"]["a"]) if row["raw"] else "as (a)"
    out.append(
      f"| {name} | {show(row['primary']['a'])} | {show(row['primary']['b'])} | {raw} | {show(row['model_free']['a'])} "
      f"| {row['step_time_ratio']:.2f}× | {row['verdict']} (p {row['p_holm']:.3f}) | {row['smallest_tellable']:.2f}× "
      f"| {row['tuning_runs']:.1f} ({row['reference_tuning_runs']:.1f}) |"
    )
  out.append("")
  for name in result["table"]:
    fn = search.space_function(name)
    centre = getattr(fn, "centre", search.Centre(why="its module's SPACE"))
    lacks = "; ".join(centre.lacks) or "nothing of AdamW's"
    out.append(
      f"* {name}: centred at {centre.lr:g}× AdamW's LR, {centre.weight_decay:g}× its weight decay ({centre.why}); "
      f"it lacks {lacks}."
    )
  return out


def judge(config: Config, workdir: str, sides: str) -> dict[str, Record]:
  """The documented command as a function: `config`'s optimizers study in cell `sides` with `sides`
  (comma-separated) against the reference, trained into `workdir` (resuming from its run cache); returns
  `table`'s plain dict, per side."""
  from hybridjax.bench import study  # the skeleton runs the studies: above this module

  c = copy.deepcopy(config)
  c.benchmark.update(study="optimizers", tuner="joint")
  c.benchmark.optimizers.update(cell="sides", sides=sides)
  return study.run(c, workdir)["table"]
