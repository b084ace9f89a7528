"""The knobs study: each side (the R4 anchor, the recipe's Muon row, the whole recipe) tuned by a
coordinate search over its own knobs (`sets.SETS`, the same number of settings per side) on the
tuning seeds, from the settings and LR the recipe's record gives it, then its LR swept again; then
each side as published and as tuned, N steps on the headline seeds, read as a paired difference.
Both sides spend the same number of tuning runs, and the record lists them.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import ml_collections

from hybridjax import codehash
from hybridjax import config as config_lib
from hybridjax.bench import protocol, search, specs, tuning
from hybridjax.bench import record as record_lib
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import recipe_record
from hybridjax.bench.studies.knobs import config as knobs_config
from hybridjax.bench.studies.knobs.config import knobs_of, side_configs
from hybridjax.bench.studies.knobs.report import markdown
from hybridjax.bench.tasks import task_path

# its record (a resumed study extends its invocations) and the blocks it compares without
RECORD, PUBLISH_IGNORES = knobs_config.RECORD, knobs_config.PUBLISH_IGNORES
AS_IS = "as is"  # a sweep's entry for the value a knob had


def header(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  b = config.benchmark
  return [f"knobs {b.preset}: sides {b.knobs.sides}, N={int(config.trainer.steps)}; workdir {workdir}"]


def side_loss(run: dict[str, Any], iterate: str) -> float:
  """A tuning run's loss as the search ranks it: raw, or averaged at the best of the betas it
  recorded (the beta is tuned with the rest; the headline runs are read at the beta chosen here)."""
  return run["final_raw"] if iterate == "raw" else tuning.averaged_loss(run)


def _with(c: ml_collections.ConfigDict, fields: dict[str, Any], lr: float | None = None) -> ml_collections.ConfigDict:
  out = ml_collections.ConfigDict(c.to_dict())
  out.update_from_flattened_dict(fields)
  if lr is not None:
    out.optim.learning_rate = float(lr)
  return out


def _evaluate(tries: list[tuple[str, ml_collections.ConfigDict]], config, runner: Runner, label: str) -> list[dict]:
  """Each (side, config) on both tuning seeds at N: {"runs", "spec_keys"} (the keys count the runs a
  side spent: a setting tried twice counts once)."""
  n, seeds = int(config.trainer.steps), [int(s) for s in config.benchmark.tuning_seeds]
  run_specs = [tuning.spec_of(c)(s, float(c.optim.learning_rate), n) for _, c in tries for s in seeds]
  results = runner.run(run_specs, label)
  return [
    {
      "runs": results[k * len(seeds) : (k + 1) * len(seeds)],
      "spec_keys": [keys.run_key(x) for x in run_specs[k * len(seeds) : (k + 1) * len(seeds)]],
    }
    for k in range(len(tries))
  ]


def coinciding_sides(sides: dict[str, tuple[ml_collections.ConfigDict, dict]], searched: dict[str, tuple]) -> dict:
  """{side: the earlier side it is}: the same config, settings and knobs (at `quick` the recipe's last
  row is its Muon row), so the same runs, which the run cache trains once and both sides read."""
  out: dict[str, str] = {}
  for i, (side, (c, settings)) in enumerate(sides.items()):
    for other, (oc, other_settings) in list(sides.items())[:i]:
      if other not in out and (c.to_dict(), settings, searched[side]) == (
        oc.to_dict(),
        other_settings,
        searched[other],
      ):
        out[side] = other
        break
  return out


def joint_state(config: ml_collections.ConfigDict, sides: dict[str, tuple], runner: Runner) -> dict[str, Any]:
  """`benchmark.tuner='joint'`: every side searched alike by the joint search (`search.search_both`, at
  equal cost), each side's state at the setting it chose, with its search's record."""
  k = config.benchmark.knobs
  searches = search.side_searches({side: c for side, (c, _) in sides.items()}, k, config)
  records = search.search_both(searches, int(k.search_configs), runner)
  state = {}
  for side in sides:
    chosen = records[side]["chosen"]
    before = config_lib.flatten(sides[side][0])
    after = config_lib.flatten(search.searched(sides[side][0], chosen))
    fields = {f: v for f, v in after.items() if before.get(f) != v and f != "optim.learning_rate"}
    state[side] = {
      "fields": fields,
      "lr": float(chosen["fields"]["optim.learning_rate"]),
      "beta": chosen["beta"],
      "iterate": chosen["iterate"],
      "loss": chosen["three_seed_mean"],
      "sweeps": [],
      "lr_sweep": {},
      "search": records[side],
    }
  return state


def train(config: ml_collections.ConfigDict, runner: Runner) -> dict[str, Any]:
  """The coordinate search of every side in lockstep (knob i of every side in one batch), the LR
  swept again, and the headline runs of each side as published and as tuned. Sides that coincide
  (`coinciding_sides`) share their runs: each is trained once. With `benchmark.tuner='joint'`, the
  joint search in place of the first two (`joint_state`)."""
  source, sides = side_configs(config)
  if str(config.benchmark.get("tuner", "lr")) == "joint":
    state = joint_state(config, sides, runner)
    return {"source": source, "sides": sides, "state": state, "headline": _headline(config, sides, state, runner)}
  searched = knobs_of(config)
  for side, other in coinciding_sides(sides, searched).items():
    print(f"--- knobs: side {side!r} is side {other!r} at this preset: the same runs, trained once", flush=True)
  state = {s: {"fields": {}, "lr": settings["lr"], "sweeps": [], "keys": set()} for s, (_, settings) in sides.items()}

  def loss_of(side: str, ev: dict) -> float:
    state[side]["keys"].update(ev["spec_keys"])
    return statistics.fmean(side_loss(r, sides[side][1]["iterate"]) for r in ev["runs"])

  base = _evaluate(
    [(s, c) for s, (c, _) in sides.items()], config, runner, "knobs: each side as published (tuning seeds, N)"
  )
  for side, ev in zip(sides, base):
    state[side]["loss"] = loss_of(side, ev)
  for i in range(max(len(searched[s]) for s in sides)):
    tries = [
      (side, knob, value)
      for side in sides
      if i < len(searched[side])
      for knob in [searched[side][i]]
      for value in knob.values_at(int(config.trainer.steps))
    ]
    evs = _evaluate(
      [(s, _with(sides[s][0], state[s]["fields"] | k.changes(v))) for s, k, v in tries],
      config,
      runner,
      f"knobs: knob {i + 1} of each side",
    )
    for side in sides:
      if i >= len(searched[side]):
        continue
      knob, st = searched[side][i], state[side]
      current = ml_collections.ConfigDict(sides[side][0].to_dict())
      current.update_from_flattened_dict(st["fields"])
      now = current
      for part in knob.fields[0].split("."):
        now = now[part]
      values = {AS_IS: st["loss"]}  # the value it had (with its schedule, for a knob that sets one)
      values |= {json.dumps(v): loss_of(s, ev) for (s, _, v), ev in zip(tries, evs) if s == side}
      chosen = min(values, key=values.get)
      if chosen != AS_IS:
        st["fields"] |= knob.changes(json.loads(chosen))
        st["loss"] = values[chosen]
      st["sweeps"].append({"knob": knob.name, "current": json.dumps(now), "values": values, "chosen": chosen})
  grids = {s: tuning.lr_grid(float(state[s]["lr"]), int(config.benchmark.knobs.lr_points)) for s in sides}
  tries = [(s, _with(sides[s][0], state[s]["fields"], lr)) for s in sides for lr in grids[s]]
  evs = _evaluate(tries, config, runner, "knobs: each side's LR swept again (tuning seeds, N)")
  lrs = [lr for s in sides for lr in grids[s]]
  betas = [float(x) for x in config.benchmark.betas]
  for side in sides:
    at = {str(lr): ev for (s, _), ev, lr in zip(tries, evs, lrs) if s == side}
    lr_losses = {lr: loss_of(side, ev) for lr, ev in at.items()}
    best = min(lr_losses, key=lr_losses.get)
    # The tuned side's averaging beta and iterate, chosen on the tuning seeds at its best LR.
    averaging = tuning.choose_averaging(at[best]["runs"], betas)
    state[side] |= {"lr_sweep": lr_losses, "lr": float(best), "loss": lr_losses[best]}
    state[side] |= {"beta": averaging["beta"], "iterate": averaging["iterate"]}
  return {"source": source, "sides": sides, "state": state, "headline": _headline(config, sides, state, runner)}


def _headline(config, sides, state, runner: Runner) -> dict[str, Any]:
  """Each side as published (at its published beta) and as tuned (at the beta its tuning chose), N
  steps on the headline seeds."""
  n, seeds = int(config.trainer.steps), [int(s) for s in config.benchmark.seeds]
  run_specs = []
  for side, (c, settings) in sides.items():
    st = state[side]
    for fields, lr, beta in (({}, settings["lr"], settings["beta"]), (st["fields"], st["lr"], st["beta"])):
      run_specs += [
        specs.run_spec(_with(c, fields), kind="anchor", seed=s, lr=lr, steps=n, beta=beta, betas=[beta]) for s in seeds
      ]
  results = runner.run(run_specs, "knobs: each side as published and as tuned (headline seeds, N)")
  out = {}
  for k, side in enumerate(sides):
    runs = results[2 * k * len(seeds) : 2 * (k + 1) * len(seeds)]
    out[side] = {"published": runs[: len(seeds)], "tuned": runs[len(seeds) :]}
  return out


def time_steps(config: ml_collections.ConfigDict, trained: dict[str, Any]) -> dict[str, Any]:
  """None: the figures are losses."""
  del config, trained
  return {}


def _keep(run: dict[str, Any]) -> dict[str, Any]:
  return {k: run[k] for k in ("seed", "final_raw", "final_averaged", "final_averaged_per_batch", "key") if k in run}


def read_of(settings: dict[str, Any], tuned: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """How each headline side is read: as published, at the record's iterate and beta; as tuned, at
  the ones its tuning chose."""
  return {
    "published": {"iterate": settings["iterate"], "beta": settings["beta"]},
    "tuned": {"iterate": tuned["iterate"], "beta": tuned["beta"]},
  }


def side_figures(published: list[dict], tuned: list[dict], read: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """A side's headline losses as published and as tuned, each read at its own iterate and beta
  (`read`: {"published", "tuned"} -> {"iterate", "beta"}), and the paired difference (tuned -
  published) judged besides the seeds' with the eval error of `tuning.paired_eval_error` (a side read
  raw is judged on the seeds' spread alone). Pure."""
  averaged = all(r["iterate"] == "averaged" for r in read.values())
  before = [tuning.iterate_loss(r, read["published"]["iterate"], read["published"]["beta"]) for r in published]
  after = [tuning.iterate_loss(r, read["tuned"]["iterate"], read["tuned"]["beta"]) for r in tuned]
  se, windows = tuning.paired_eval_error(tuned, published, [x - y for x, y in zip(after, before)], averaged)
  difference = protocol.paired_difference(after, before, se, eval_windows=windows)
  return {"published": before, "tuned": after, "difference": difference}


def on_anchor_curve(losses: list[float], seeds: list[int], curves: dict[str, Any], n: int) -> dict[str, Any]:
  """`losses` (one per seed in `seeds`) read as the recipe record reads its steps: the R4 anchor's
  steps to reach each on that seed's averaged budget curve (`curves`: seed -> {steps, loss}), over
  N. Pure: the tests recompute it from the record and the recipe record it names."""
  per_seed, lower, upper = [], [], []
  for s, loss in zip(seeds, losses):
    reach = protocol.steps_to_reach_at_n(curves[str(s)]["steps"], curves[str(s)]["loss"], loss, n)
    per_seed.append(None if reach.steps is None else reach.steps / n)
    lower.append(reach.lower_bound)
    upper.append(reach.upper_bound)
  present = [x for x in per_seed if x is not None]
  mean, std = protocol.mean_std(present) if present else (None, None)
  return {"mean": mean, "std": std, "per_seed": per_seed, "lower_bound": any(lower), "upper_bound": any(upper)}


def anchor_reading(recipe: dict[str, Any], sides: dict[str, Any], seeds: list[int], n: int) -> dict[str, Any]:
  """Every side's headline losses, as published and as tuned, read on the recipe record's R4 anchor
  curve (`on_anchor_curve`), and whether the anchor side as published, re-run here, gives the recipe
  record's anchor loss at N bit for bit on each seed (then its curve is this code's too)."""
  curves = recipe["anchor"]["curves"]
  if not all(str(s) in curves for s in seeds):  # fresh headline seeds: the record's curve has none of them
    return {"on_r4_curve": None, "anchor_reproduced": None}
  out = {
    side: {k: on_anchor_curve(s[k], seeds, curves, n) for k in ("published", "tuned")} for side, s in sides.items()
  }
  reproduced = None
  if "anchor" in sides:
    at_n = recipe["anchor"]["at_n"]
    reproduced = {str(s): loss == at_n[str(s)] for s, loss in zip(seeds, sides["anchor"]["published"])}
  return {"on_r4_curve": out, "anchor_reproduced": reproduced}


def record(
  config: ml_collections.ConfigDict, trained: dict[str, Any], timed: dict[str, Any], command: str, runner: Runner
) -> dict[str, Any]:
  del timed, command, runner
  task = task_path(specs.task_name(config))
  out = {}
  for side, (_, settings) in trained["sides"].items():
    st, head = trained["state"][side], trained["headline"][side]
    out[side] = {
      "published_settings": settings,
      "tuned_fields": st["fields"],
      "tuned_lr": st["lr"],
      "tuned_read": {"iterate": st["iterate"], "beta": st["beta"]},
      "sweeps": st["sweeps"],
      "lr_sweep": st["lr_sweep"],
      # N-step runs on the tuning seeds (the joint search: its N-run equivalents, its record beside)
      "tuning_runs": st["search"]["search_runs"] if "search" in st else len(st["keys"]),
      "runs": {k: [_keep(r) for r in head[k]] for k in ("published", "tuned")},
    } | side_figures(head["published"], head["tuned"], read_of(settings, st))
    if "search" in st:
      out[side]["search"] = st["search"]
  seeds = [int(s) for s in config.benchmark.seeds]
  coinciding = coinciding_sides(trained["sides"], knobs_of(config))
  same = {"same_runs": coinciding} if coinciding else {}
  b = config.benchmark
  _, recipe = recipe_record(str(b.preset), str(b.knobs.lrs_from), "benchmark.knobs.lrs_from")
  return (
    {
      "code_version": keys.code_versions(config, []),
      "library_versions": codehash.library_versions([keys.RUNNER_MODULES["anchor"], task]),
      "lrs_from": trained["source"],
      "seeds": seeds,
      "tuning_seeds": [int(s) for s in config.benchmark.tuning_seeds],
      "tuner": str(config.benchmark.get("tuner", "lr")),
      "sides": out,
    }
    | same
    | anchor_reading(recipe, out, seeds, int(config.trainer.steps))
  )


def write(result: dict[str, Any], trained: dict[str, Any], workdir: str, publish: str) -> None:
  """Its record into `workdir` and `publish`, unless `publish` holds one of another config
  (`record.write_and_publish`; the validate hook refused it before training)."""
  del trained
  record_lib.write_and_publish(result, workdir, publish, RECORD, markdown, ignore=PUBLISH_IGNORES)
