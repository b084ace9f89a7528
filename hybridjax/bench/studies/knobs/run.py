"""The knobs study: each side (the R4 anchor, the recipe's Muon row, the whole recipe) tuned by a
coordinate search over its own knobs (`sets.SETS`, the same number of settings per side) on the
tuning seeds, from the settings and LR the recipe's record gives it, then its LR swept again; then
each side as published and as tuned, N steps on the headline seeds, read as a paired difference.
Both sides spend the same number of tuning runs, and the record lists them.
"""

from __future__ import annotations

import json
import statistics

from hybridjax import config as config_lib
from hybridjax.bench import comparison, search, specs, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import recipe_record
from hybridjax.bench.studies import FINALS, Config, Record, Study, copied, kept, tuner
from hybridjax.bench.studies.knobs import config as knobs_config
from hybridjax.bench.studies.knobs import curves
from hybridjax.bench.studies.knobs.config import knobs_of, side_configs
from hybridjax.bench.studies.knobs.report import markdown

AS_IS = "as is"  # a sweep's entry for the value a knob had


def header(config: Config, workdir: str) -> list[str]:
  b = config.benchmark
  return [f"knobs {b.preset}: sides {b.knobs.sides}, N={int(config.trainer.steps)}; workdir {workdir}"]


def coinciding_sides(sides: dict[str, tuple[Config, dict]], searched: dict[str, tuple]) -> dict:
  """{side: the earlier side it is}: the same config, settings and knobs (at `quick` the recipe's last
  row is its Muon row), so the same runs, which the run cache trains once and both sides read."""
  made = {side: (c.to_dict(), settings, searched[side]) for side, (c, settings) in sides.items()}
  out: dict[str, str] = {}
  for i, side in enumerate(made):
    same = [other for other in list(made)[:i] if other not in out and made[other] == made[side]]
    if same:
      out[side] = same[0]
  return out


def joint_state(config: Config, sides: dict[str, tuple], runner: Runner) -> Record:
  """`benchmark.tuner='joint'`: every side searched alike by the joint search (`search.search_both`, at
  equal cost), each side's state at the setting it chose, with its search's record; with
  `knobs.search_from`, each side's search taken from that record (`curves.searched_from`), not run again."""
  k = config.benchmark.knobs
  if str(k.search_from):
    records = curves.searched_from(config)
  else:
    searches = search.side_searches({side: c for side, (c, _) in sides.items()}, k, config)
    records = search.search_both(searches, int(k.search_configs), runner)
  state = {}
  for side, (c, _) in sides.items():
    chosen = records[side]["chosen"]
    before, after = config_lib.flatten(c), config_lib.flatten(search.apply_setting(c, chosen["fields"]))
    state[side] = {
      "fields": {f: v for f, v in after.items() if before.get(f) != v and f != "optim.learning_rate"},
      "lr": float(chosen["fields"]["optim.learning_rate"]),
      "beta": chosen["beta"],
      "iterate": chosen["iterate"],
      "loss": chosen["three_seed_mean"],
      "sweeps": [],
      "lr_sweep": {},
      "search": records[side],
    }
  return state


def train(config: Config, runner: Runner) -> Record:
  """The coordinate search of every side in lockstep (knob i of every side in one batch), the LR
  swept again, and the headline runs of each side as published and as tuned. Sides that coincide
  (`coinciding_sides`) share their runs: each is trained once. With `benchmark.tuner='joint'`, the
  joint search in place of the first two (`joint_state`)."""
  source, sides = side_configs(config)
  if tuner(config) == "joint":
    state = joint_state(config, sides, runner)
    headline = _headline(config, sides, state, runner)
    spans = curves.train(config, sides, state, runner) if curves.reads_curves(config) else {}
    return {"source": source, "sides": sides, "state": state, "headline": headline, "curves": spans}
  searched = knobs_of(config)
  for side, other in coinciding_sides(sides, searched).items():
    print(f"--- knobs: side {side!r} is side {other!r} at this preset: the same runs, trained once", flush=True)
  state = {s: {"fields": {}, "lr": settings["lr"], "sweeps": [], "keys": set()} for s, (_, settings) in sides.items()}
  n, seeds = int(config.trainer.steps), specs.ints(config.benchmark.tuning_seeds)

  def evaluate(tries: list[tuple[str, Record]], label: str) -> list[tuple[float, list[Record]]]:
    """Each (side, fields) of `tries`, its side's config with those fields, on both tuning seeds at N: (its
    mean loss at the side's iterate, its runs). The runs' keys count the runs a side spent (a setting tried
    twice counts once)."""
    configs = [copied(sides[side][0], fields) for side, fields in tries]
    run_specs = [tuning.spec_of(c)(s, float(c.optim.learning_rate), n) for c in configs for s in seeds]
    results, asked, out = iter(runner.run(run_specs, label)), iter(run_specs), []
    for side, _ in tries:
      runs = [next(results) for _ in seeds]
      state[side]["keys"].update(keys.run_key(next(asked)) for _ in seeds)
      out.append((statistics.fmean(tuning.iterate_loss(r, sides[side][1]["iterate"], None) for r in runs), runs))
    return out

  for side, (loss, _) in zip(
    sides, evaluate([(s, {}) for s in sides], "knobs: each side as published (tuning seeds, N)")
  ):
    state[side]["loss"] = loss
  for i in range(max(len(searched[s]) for s in sides)):
    tries = [
      (side, knob, value)
      for side in sides
      if i < len(searched[side])
      for knob in [searched[side][i]]
      for value in knob.values_at(n)
    ]
    evs = evaluate([(s, state[s]["fields"] | k.changes(v)) for s, k, v in tries], f"knobs: knob {i + 1} of each side")
    for side in [s for s in sides if i < len(searched[s])]:
      knob, st = searched[side][i], state[side]
      now = copied(sides[side][0], st["fields"])[knob.fields[0]]
      values = {AS_IS: st["loss"]}  # the value it had (with its schedule, for a knob that sets one)
      values |= {json.dumps(v): loss for (s, _, v), (loss, _) in zip(tries, evs) if s == side}
      chosen = min(values, key=values.get)
      if chosen != AS_IS:
        st["fields"] |= knob.changes(json.loads(chosen))
        st["loss"] = values[chosen]
      st["sweeps"].append({"knob": knob.name, "current": json.dumps(now), "values": values, "chosen": chosen})
  grids = {s: tuning.lr_grid(float(state[s]["lr"]), int(config.benchmark.knobs.lr_points)) for s in sides}
  tries = [(s, lr) for s in sides for lr in grids[s]]
  label = "knobs: each side's LR swept again (tuning seeds, N)"
  evs = evaluate([(s, state[s]["fields"] | {"optim.learning_rate": float(lr)}) for s, lr in tries], label)
  betas = [float(x) for x in config.benchmark.betas]
  for side in sides:
    at = {str(lr): ev for (s, lr), ev in zip(tries, evs) if s == side}
    lr_losses = {lr: loss for lr, (loss, _) in at.items()}
    best = min(lr_losses, key=lr_losses.get)
    # The tuned side's averaging beta and iterate, chosen on the tuning seeds at its best LR.
    averaging = tuning.choose_averaging(at[best][1], betas)
    state[side] |= {"lr_sweep": lr_losses, "lr": float(best), "loss": lr_losses[best]}
    state[side] |= {"beta": averaging["beta"], "iterate": averaging["iterate"]}
  return {"source": source, "sides": sides, "state": state, "headline": _headline(config, sides, state, runner)}


def _headline(config, sides, state, runner: Runner) -> Record:
  """Each side as published (at its published beta) and as tuned (at the beta its tuning chose), N
  steps on the headline seeds."""
  n, seeds = int(config.trainer.steps), specs.ints(config.benchmark.seeds)
  run_specs = []
  for side, (c, settings) in sides.items():
    st = state[side]
    for fields, lr, beta in (({}, settings["lr"], settings["beta"]), (st["fields"], st["lr"], st["beta"])):
      run_specs += [
        specs.run_spec(copied(c, fields), kind="anchor", seed=s, lr=lr, steps=n, beta=beta, betas=[beta]) for s in seeds
      ]
  results = iter(runner.run(run_specs, "knobs: each side as published and as tuned (headline seeds, N)"))
  return {side: {k: [next(results) for _ in seeds] for k in ("published", "tuned")} for side in sides}


def read_of(settings: Record, tuned: Record) -> dict[str, Record]:
  """How each headline side is read: as published, at the record's iterate and beta; as tuned, at
  the ones its tuning chose."""
  return {k: {"iterate": x["iterate"], "beta": x["beta"]} for k, x in (("published", settings), ("tuned", tuned))}


def side_figures(published: list[dict], tuned: list[dict], read: dict[str, Record]) -> Record:
  """A side's headline losses as published and as tuned, each read at its own iterate and beta
  (`read`: {"published", "tuned"} -> {"iterate", "beta"}), and their paired difference (tuned -
  published, `comparison.paired_reading`). Pure."""
  after, before, difference = comparison.paired_reading(tuned, read["tuned"], published, read["published"])
  return {"published": before, "tuned": after, "difference": difference}


def anchor_reading(recipe: Record, sides: Record, seeds: list[int], n: int) -> Record:
  """Every side's headline losses, as published and as tuned, read on the recipe record's R4 anchor
  curve (`comparison.on_anchor_curve`), and whether the anchor side as published, re-run here, gives the recipe
  record's anchor loss at N bit for bit on each seed (then its curve is this code's too). Only the headline
  seeds the record's curve holds are read (`on_r4_curve_seeds` names them where some are not); none: no
  reading (the joint tuner's curves read each side on its own)."""
  curves = recipe["anchor"]["curves"]
  held = [k for k, s in enumerate(seeds) if str(s) in curves]
  if not held:
    return {"on_r4_curve": None, "anchor_reproduced": None}
  on = [seeds[k] for k in held]
  out = {
    side: {k: comparison.on_anchor_curve([s[k][j] for j in held], on, curves, n) for k in ("published", "tuned")}
    for side, s in sides.items()
  }
  reproduced = None
  if "anchor" in sides:
    at_n = recipe["anchor"]["at_n"]
    reproduced = {str(seeds[j]): sides["anchor"]["published"][j] == at_n[str(seeds[j])] for j in held}
  return {"on_r4_curve": out, "anchor_reproduced": reproduced} | ({} if on == seeds else {"on_r4_curve_seeds": on})


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  del command, runner
  out = {}
  for side, (_, settings) in trained["sides"].items():
    st, head = trained["state"][side], trained["headline"][side]
    read = read_of(settings, st)
    out[side] = {
      "published_settings": settings,
      "tuned_fields": st["fields"],
      "tuned_lr": st["lr"],
      "tuned_read": read["tuned"],
      "sweeps": st["sweeps"],
      "lr_sweep": st["lr_sweep"],
      # N-step runs on the tuning seeds (the joint search: its N-run equivalents, its record beside)
      "tuning_runs": st["search"]["search_runs"] if "search" in st else len(st["keys"]),
      "runs": {k: [kept(r, ("seed", *FINALS, "key")) for r in head[k]] for k in ("published", "tuned")},
    } | side_figures(head["published"], head["tuned"], read)
    if "search" in st:
      out[side]["search"] = st["search"]
  seeds = specs.ints(config.benchmark.seeds)
  coinciding = coinciding_sides(trained["sides"], knobs_of(config))
  same = {"same_runs": coinciding} if coinciding else {}
  _, recipe = recipe_record(config, "knobs")
  if trained.get("curves"):
    published = {str(s): x for s, x in zip(seeds, out["anchor"]["published"])}
    same["curves"] = curves.record(config, trained["curves"], published, timed)
  return (
    {
      **comparison.code_record(config),
      "record_stem": knobs_config.record_stem(config),
      "lrs_from": trained["source"],
      "seeds": seeds,
      "tuning_seeds": specs.ints(config.benchmark.tuning_seeds),
      "tuner": tuner(config),
      "sides": out,
    }
    | same
    | anchor_reading(recipe, out, seeds, int(config.trainer.steps))
  )


# 'lr': the coordinate search and the LR swept again; 'joint': `bench.search`
STUDY = Study(
  header,
  train,
  record,
  markdown,
  knobs_config.RECORD,
  tuners=("lr", "joint"),
  time_steps=curves.time_steps,
)
