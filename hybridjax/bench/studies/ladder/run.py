"""The fairness ladder (docs/benchmark.md, "The fairness ladder"): every method arm measured against
the baseline of each rung (`rungs.py`), from a claim's own conditions (R0) up to the tuned, averaged
baselines (R4-R6), on the same headline seeds, with the arm's settings as configured.

Runs are shared where rungs allow (a group: R0/R1 one set, R3/R4 another, one run recording its raw
and its averaged iterate), and go through the runner's cache, so a ladder resumes where it stopped.
Runs on an early plateau (`figures.plateau_runs`) are flagged; a group with one extends its headline
seeds by `benchmark.plateau_seeds`.
"""

from __future__ import annotations

import json
import math
import os

from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures, specs, timing, tuning
from hybridjax.bench import record as record_lib
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import Config, Record, Study, copied
from hybridjax.bench.studies.family import config as family_config
from hybridjax.bench.studies.family import report as family_report
from hybridjax.bench.studies.family import run as family_run
from hybridjax.bench.studies.ladder import config as ladder_config
from hybridjax.bench.studies.ladder import rungs
from hybridjax.bench.studies.ladder.figures import timed_rung_figures, untuned_position
from hybridjax.bench.studies.ladder.report import ladder_markdown as markdown
from hybridjax.bench.studies.ladder.report import save_ladder_plot


def constant_curve_spec(config: Config, seed: int, lr: float) -> Record:
  """One 2N run at a constant LR, evaluated `ladder.constant_eval_points` times: its eval curve is the
  budget curve of every budget up to 2N (a constant schedule does not depend on the budget)."""
  n = int(config.trainer.steps)
  spec = specs.run_spec(config, kind="anchor", seed=seed, lr=lr, steps=2 * n, beta=float(config.trainer.averaging_beta))
  every = max(2 * n // int(config.benchmark.ladder.constant_eval_points), 1)
  spec["config"]["trainer"].update(eval_every=every, log_every=every)
  return spec


def constant_sweep(config: Config, runner: Runner) -> Record:
  """R2's LR sweep at a constant LR on the tuning seeds (`tuning.sweep_lrs`): a sqrt(2) grid upwards
  from the untuned LR, extended while the best sits at an edge; ranked by the raw loss at N (R2's
  iterate); the best two checked on the second tuning seed."""
  b = config.benchmark
  # the grid's first LR is the untuned one
  centred = copied(
    config, {"optim.learning_rate": float(b.ladder.untuned_lr) * math.sqrt(2) ** (int(b.lr_points) // 2)}
  )
  beta = float(config.trainer.averaging_beta)

  def spec(seed: int, lr: float, steps: int) -> Record:
    return specs.run_spec(config, kind="anchor", seed=seed, lr=lr, steps=steps, beta=beta)

  swept = tuning.sweep_lrs([(centred, spec, lambda r: r["final_raw"])], runner)[0]
  return {
    "grid": swept["grid"],
    "raw_loss": [r["final_raw"] for r in swept["sweep"]],
    "best_two_means": {str(k): v for k, v in swept["means"].items()},
    "best_lr": swept["best_lr"],
    "best_at_edge": swept["best_at_edge"],
  }


def method_record(r: Record) -> Record:
  """What ladder.json keeps of a method run: enough to recompute every figure, with the method's own
  summary figures (e.g. the jump predictor's accepted jumps, which say whether the arm was exercised)."""
  keep = ("method", "seed", "lr", "steps", "final_raw", "final_averaged", "backward_passes", "validation_forwards")
  stats = list(r.get("method_stats", []))
  return (
    {k: r[k] for k in keep}
    | {"step_kinds": r["step_kinds"], "curve": r["curve"], "key": r.get("key")}
    | {k: r[k] for k in stats if k in r}
    | ({"method_stats": stats} if stats else {})
  )


def train_group(config: Config, group: str, runner: Runner) -> Record:
  """A group's runs, as plain data: per seed the baseline's curve ({'steps', 'raw', 'averaged'} and
  the N-step run's curve for the plateau check), and every arm's method runs."""
  n = int(config.trainer.steps)
  b = config.benchmark
  methods = rungs.names(b.methods)
  seeds = specs.ints(b.seeds)
  out: Record = {"seeds": seeds, "methods": methods, "family": b.family}
  beta = float(config.trainer.averaging_beta)
  if group in rungs.CONSTANT_GROUPS:
    if group == "untuned":
      lr = float(b.ladder.untuned_lr)
    else:
      out["sweep"] = constant_sweep(config, runner)
      lr = out["sweep"]["best_lr"]
    curve_specs = [constant_curve_spec(config, s, lr) for s in seeds]
    results = runner.run(
      curve_specs + tuning.method_specs(config, methods, lr, beta), f"{group} group: 2N constant curves and the arms"
    )
    out["lr"], out["beta"] = lr, beta
    out["baseline"] = {
      str(r["seed"]): {
        "steps": [p["step"] for p in r["curve"]],
        "raw": [p["eval_loss_raw"] for p in r["curve"]],
        "averaged": [p["eval_loss_averaged"] for p in r["curve"]],
        "key": r.get("key"),
      }
      for r in results[: len(seeds)]
    }
    mruns = results[len(seeds) :]
  else:
    trained = family_run.train_family(config, runner, methods)
    out["family_runs"] = trained
    tuned, curves = trained["tuning"], trained["curves"]
    out["eval"] = figures.eval_errors(curves["runs"], [str(s) for s in seeds], curves["budgets"], n)
    out["lr"], out["beta"] = tuned["best_lr"], tuned["averaging_beta"]
    keep = ("grid", "best_lr", "best_lr_for_raw_loss", "best_at_edge", "averaging_beta", "per_budget_lr")
    out["tuning"] = {k: tuned[k] for k in (*keep, "seed_noise", "iterate", "iterate_losses")}
    out["baseline"] = {
      s: {
        "steps": curves["budgets"],
        "raw": curves["curves"]["baseline"][s],
        "averaged": curves["curves"]["averaged_baseline"][s],
        "n_run_curve": curves["runs"][f"{s}/{n}"]["curve"],
        "key": curves["runs"][f"{s}/{n}"].get("key"),
      }
      for s in curves["curves"]["baseline"]
    }
    mruns = [r for m in methods for r in trained["method_runs"][m].values()]
  out["method_runs"] = {m: {} for m in methods}
  for r in mruns:
    out["method_runs"][r["method"]][str(r["seed"])] = method_record(r)
  out["plateaus"] = plateaus(out, n, float(b.plateau_margin))
  return out


def plateaus(group: Record, n: int, margin: float) -> list[Record]:
  """The group's runs that sit on an early plateau: a raw eval loss at N/10 or at N more than
  `margin` (relative) above the median of the same arm's runs (or the baseline's) over the seeds,
  read at the eval point nearest there. Comparing a run with its own arm's other seeds flags a seed
  that fell behind, never an arm that is simply worse."""
  kinds: dict[str, dict[str, list[Record]]] = {"baseline": {}}
  for s, base in group["baseline"].items():
    kinds["baseline"][s] = base.get("n_run_curve") or [
      {"step": t, "eval_loss_raw": raw} for t, raw in zip(base["steps"], base["raw"]) if t <= n
    ]
  for m, per in group["method_runs"].items():
    kinds[m] = {s: r["curve"] for s, r in per.items()}
  return figures.plateau_runs(kinds, n, margin)


RECORD = ladder_config.RECORD  # its record, whose invocations a resumed ladder extends


def header(config: Config, workdir: str) -> list[str]:
  b = config.benchmark
  return [f"ladder {b.preset}: rungs {b.ladder.rungs}, N={int(config.trainer.steps)}; workdir {workdir}"]


def train(config: Config, runner: Runner) -> Record:
  """What the ladder's rungs need: {'groups': the runs of each group}, every group the chosen rungs
  need, in `GROUP_ORDER`; a group with a plateau run is extended to the plateau seeds (its runs
  already trained are cached)."""
  groups: dict[str, Record] = {}
  seeds, extra = specs.plateau_extension(config)
  for group in [g for g in rungs.GROUP_ORDER if g in rungs.groups_of(config)]:
    groups[group] = train_group(rungs.group_config(config, group, seeds), group, runner)
    if groups[group]["plateaus"] and extra:
      print(f"--- {group}: plateau runs {groups[group]['plateaus']}; adding seeds {extra}", flush=True)
      groups[group] = train_group(rungs.group_config(config, group, seeds + extra), group, runner)
      groups[group]["extended_for_plateau"] = True
  return {"groups": groups}


def time_steps(config: Config, trained: Record) -> Record:
  """Every arm's step times, interleaved: AdamW's arms together, Muon's and the speedrun's apart."""
  groups = trained["groups"]
  timed: Record = {}
  for key in dict.fromkeys(map(rungs.timing_key, rungs.GROUP_ORDER)):
    ran = [g for g in rungs.GROUP_ORDER if g in groups and rungs.timing_key(g) == key]
    if ran:
      g, all_arms = groups[ran[0]], list(dict.fromkeys(m for name in ran for m in groups[name]["methods"]))
      tuned = {"best_lr": g["lr"], "averaging_beta": g["beta"]}
      timed[key] = timing.time_step_kinds(rungs.group_config(config, ran[0], g["seeds"]), tuned, all_arms)
  return timed


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  """ladder.json's record (after the header); each tuned group's family record goes into `trained`
  ('families'), for `write`."""
  b = config.benchmark
  groups = trained["groups"]
  families = {}
  for g in rungs.TUNED_GROUPS:
    if g in groups:
      cfg = rungs.group_config(config, g, groups[g]["seeds"])
      # The family's headline arm is the protocol's (`benchmark.methods`' first), where it ran.
      ran = rungs.names(cfg.benchmark.methods)
      first = [m for m in rungs.names(b.methods) if m in ran][:1]
      runs = groups[g].pop("family_runs") | {"methods": first + [m for m in ran if m not in first]}
      runs["notes"] = family_run.task_notes(cfg)
      families[g] = family_run.record(cfg, runs, timed[rungs.timing_key(g)], command, runner)
  trained["families"] = families
  return {
    "code_version": keys.code_versions(config, list(arms_lib.arms(config))),
    "rung_names": rungs.rungs_of(config),
    "verdict_rungs": [r for r in rungs.VERDICT if r in rungs.rungs_of(config)],
    "untuned_lr": float(b.ladder.untuned_lr),
    "untuned_position": untuned_position(groups, float(b.ladder.untuned_lr)),
    "groups": groups,
    "timing": timed,
    "rungs": timed_rung_figures(config, groups, timed, int(config.trainer.steps)),
  }


def join(earlier: Record, later: Record) -> Record:
  """One ladder of the same config from two invocations that ran different rungs (e.g. R6 added to a
  published R0-R5): the groups and timings of both, every rung recomputed from them, the commands in
  order (running both reproduces the result), the compute and code versions of every invocation, the
  config of both (a field only one record holds, from that one: an older record lacks the fields
  added since). A ValueError where they do not join (`config.join_problem`: another config, or a
  rung or group both ran)."""
  fields = [f for f in ("preset", "task", "steps") if earlier[f] != later[f]]
  lines = [f"{f}: {earlier[f]!r} there, {later[f]!r} here" for f in fields]
  why, more = ladder_config.join_problem(earlier, record_lib.stored_config(later), later["rung_names"], later["groups"])
  if lines or why:
    raise ValueError(f"cannot join ladders: {why or 'a ladder of another config'} ({'; '.join(lines + more)})")
  out = json.loads(json.dumps(earlier))
  out["rung_names"] = [r for r in rungs.RUNGS if r in earlier["rung_names"] + later["rung_names"]]
  out["verdict_rungs"] = [r for r in rungs.VERDICT if r in out["rung_names"]]
  out["config"] = merged(record_lib.stored_config(later).to_dict(), record_lib.stored_config(earlier).to_dict())
  out["config"]["benchmark"]["ladder"]["rungs"] = ",".join(out["rung_names"])
  out["groups"] |= later["groups"]
  out["timing"] |= later["timing"]
  out["rungs"] = timed_rung_figures(Config(out["config"]), out["groups"], out["timing"], out["steps"])
  out["untuned_position"] = untuned_position(out["groups"], float(out["untuned_lr"]))
  out["command"] = f"{earlier['command']}; {later['command']}"
  out["date"] = later["date"]
  for field in ("wall_s", "runs_trained", "runs_cached"):
    out[field] = earlier[field] + later[field]

  def calls(result: Record) -> list[Record]:
    return [{"rungs": result["rung_names"], "code_version": result["code_version"], **c} for c in result["invocations"]]

  out["invocations"] = calls(earlier) + calls(later)
  return out


def merged(base: Record, over: Record) -> Record:
  """The nested dict `base` with every leaf of `over` set over it."""
  out = dict(base)
  for k, v in over.items():
    out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
  return out


def write(result: Record, trained: Record, workdir: str, publish: str) -> None:
  """ladder-<preset>.{json,md,png} into `workdir` and `publish`; each cosine family's protocol results
  into `workdir/<family>` and, published, beside the ladder as `<preset>-<family>`. A published ladder
  of the same config that ran other rungs (on other runs) is joined with this one (`join`). Where the
  published ladder would not join (another config, or a rung this one ran too) or a family folder
  holds another config's family, nothing is published: the ValueError says why, after the workdir's
  copy is written (the study's validate hook, `config.check_publish`, refuses such a folder before
  any training; this is the check at the moment of writing)."""
  record_lib.write_files(result, workdir, RECORD, markdown, save_ladder_plot)
  for fam in trained["families"].values():
    fam["wall_s"] = result["wall_s"]
    os.makedirs(os.path.join(workdir, fam["family"]), exist_ok=True)
    fam["plots"] = family_report.write_results(fam, os.path.join(workdir, fam["family"]))
  if not publish:
    return
  families = trained["families"].values()
  targets = {fam["family"]: ladder_config.family_folder(publish, fam["preset"], fam["family"]) for fam in families}
  try:  # the published ladder and every family folder checked before anything is written
    args = (result["preset"], result["config"], result["rung_names"], result["groups"])
    earlier = ladder_config.published_ladder(publish, *args)
    for fam in families:
      family_config.check_publish(fam["config"], targets[fam["family"]])
  except ValueError as e:
    raise ValueError(f"{e}. Nothing was published; this invocation's results are in {workdir}") from None
  record_lib.write_files(join(earlier, result) if earlier else result, publish, RECORD, markdown, save_ladder_plot)
  for fam in families:
    family_report.publish_results(fam, os.path.join(workdir, fam["family"]), targets[fam["family"]], fam["plots"])


STUDY = Study(header, train, record, markdown, RECORD, time_steps=time_steps, write=write)
