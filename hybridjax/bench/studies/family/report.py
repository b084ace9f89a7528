"""A family's results.md, its verdicts, its plots and the files it writes."""

from __future__ import annotations

import json
import os
import shutil
import statistics

from hybridjax.bench import plots, protocol
from hybridjax.bench.cells import (
  eval_note,
  paired_cell,
  pays_clause,
  pm,
  ratio_cell,
  se_cell,
  verdict_rule,
  verdict_word,
  wallclock_cell,
  with_exercise,
)
from hybridjax.bench.figures import ANCHORS
from hybridjax.bench.studies import Record
from hybridjax.bench.studies.family import config as family_config


def tuning_noise(t: Record) -> str:
  """The sentence on the noise the tuning's budget checks judge a difference of two LRs' losses by."""
  if "seed_spread" not in t:  # a tuning recorded before the paired per-batch error
    return f"Seed noise of one final loss: {t['seed_noise']:.4f}."
  paired = t.get("eval_paired_se")
  floor = "cannot be estimated (one eval batch)" if paired is None else f"{paired:.4f}"
  return (
    f"Noise of a difference of two final losses (the budget checks'): {t['seed_noise']:.4f}, the larger of the "
    f"tuning seeds' spread ({t['seed_spread']:.4f}) and the eval set's paired per-batch error of the best two "
    f"LRs' runs ({floor})."
  )


def markdown(result: Record) -> str:
  """results.md: the tuning, the anchors and one column per method arm (means ± std over seeds)."""
  t, a = result["tuning"], result["anchor_figures"]
  lines = [
    f"# Benchmark: preset `{result['preset']}`, family `{result['family']}`",
    "",
    f"N = {result['steps']} steps; headline seeds {result['seeds']}, tuning seeds {result['tuning_seeds']}; "
    f"command: `{result['command']}`",
    "",
    "## Tuning (tuning seeds only)",
    "",
    "| peak LR | seed | steps | raw final loss | averaged final loss |",
    "|---|---|---|---|---|",
  ]
  for r in sorted(t["rows"], key=lambda r: (r["budget"], r["seed"], r["lr"])):
    lines.append(f"| {r['lr']:.3g} | {r['seed']} | {r['budget']} | {r['loss_raw']:.4f} | {r['loss_averaged']:.4f} |")
  lines += [
    "",
    f"Best LR {t['best_lr']:.3g} (mean of the best two over both tuning seeds: "
    + ", ".join(f"{float(k):.3g}: {v:.4f}" for k, v in t["best_two_means"].items())
    + f"); best for the raw loss alone: {t['best_lr_for_raw_loss']:.3g}. Per-budget LR: "
    + ", ".join(f"{k}N {v:.3g}" for k, v in t["per_budget_lr"].items())
    + ".",
    f"Averaging beta {t['averaging_beta']} (averaged loss on the two tuning seeds: "
    + ", ".join(f"{k}: {statistics.fmean(v):.4f}" for k, v in t["beta_table"].items())
    + f"). {tuning_noise(t)}",
    "",
    "## Anchors (headline seeds)",
    "",
    "| budget | " + " | ".join(ANCHORS) + " |",
    "|---|---|---|",
  ]
  for i, steps in enumerate(result["budgets"]):
    cells = [protocol.mean_std([result["curves"][an][s][i] for s in result["curves"][an]]) for an in ANCHORS]
    lines.append(f"| {steps} | " + " | ".join(pm(c) for c in cells) + " |")
  steps_lead = a["averaging_lead_steps"]
  lead = [x for x in steps_lead["per_seed"] if x is not None]
  upper = steps_lead.get("upper_bound") or [False] * len(lead)
  lines += [
    "",
    "Averaging's lead at N, in baseline steps (per seed): "
    + ", ".join(
      "not reached" if x is None else ("≤ " if up else "") + f"{x:+.0f}" for x, up in zip(steps_lead["per_seed"], upper)
    )
    + (f" (mean {statistics.fmean(lead):+.0f})" if lead else "")
    + ("; lower bounds: " + str(steps_lead["lower_bound"]) if any(steps_lead["lower_bound"]) else "")
    + ".",
  ]
  ph = result["phenomena"]
  worth = [w["steps"] for w in ph["averaging_worth_mid_run"]]
  lines.append(
    "Averaged params mid-run are worth "
    + ", ".join("more than the rest of the run" if w is None else f"{w:.0f}" for w in worth)
    + " steps of the raw run (per seed)."
  )
  if "budget_1.25N_vs_N" in ph:
    lines.append(
      "1.25N against N (paired): "
      + "; ".join(f"{an} {se_cell(d)} → {verdict_word(d)}" for an, d in ph["budget_1.25N_vs_N"].items())
      + "."
    )
  lines.append(f"Eval set: {result['eval']['batches']} batches. {eval_note(result['eval'])}")
  methods = list(result["figures"])
  if methods:
    lines += ["", "## Method arms (headline seeds; ratios > 1 mean fewer than the anchor needs)", ""]
    lines += ["| figure | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]

    def row(label, cell):
      lines.append(f"| {label} | " + " | ".join(cell(result["figures"][m], m) for m in methods) + " |")

    for an in ANCHORS:
      for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
        shown = wallclock_cell if key == "wallclock_ratio" else ratio_cell
        row(f"{key} vs {an}", lambda f, m: shown(f[an][key], f[an].get("verdict")))
    for an in ANCHORS:
      row(
        f"final loss − {an} at N",
        lambda f, m: with_exercise(
          f"{100 * f[an]['final_loss_gap']['mean']:+.2f}%"
          + (f" ({verdict_word(f[an]['paired_difference'])})" if f[an]["paired_difference"] else ""),
          f,
        ),
      )
    row("final loss (its model: averaged)", lambda f, m: pm(f["final_loss"]))
    row("final loss of its raw params", lambda f, m: pm(f["final_loss_raw"]))
    row("backward passes", lambda f, m: pm(f["backward_passes"], 0))
    row("validation / probe forwards", lambda f, m: pm(f["validation_forwards"], 0))
    # The methods' own summary figures, one row each (e.g. the jump predictor's accepted jumps).
    stats = dict.fromkeys(k for f in result["figures"].values() for k in f.get("method_stats", []))
    for k in stats:
      row(k.replace("_", " "), lambda f, m: pm(f.get(k), 4) if f.get(k) else "")
    if any("vs_skip_control" in f for f in result["figures"].values()):
      row(
        "final loss − control arm (paired)",
        lambda f, m: with_exercise(paired_cell(f.get("vs_skip_control")), f) if "vs_skip_control" in f else "—",
      )
    ms = result["timing"]["ms_per_step"]
    row("median ms per step by kind", lambda f, m: ", ".join(f"{k} {v:.1f}" for k, v in sorted(ms[m].items())))
    lines += [
      "",
      f"Baseline step: {ms['baseline']['baseline']:.2f} ms (median, interleaved).",
      "",
      "## Verdicts (against the averaged anchor)",
      "",
      *family_verdicts(result),
    ]
  lines += [
    "",
    "Compile time (s, separate from every figure): "
    + json.dumps({k: round(v, 1) for k, v in result["timing"]["compile_s"].items()})
    + ".",
    f"Wall time {result['wall_s']:.0f} s ({result['runs_trained']} runs trained, {result['runs_cached']} from the "
    f"cache); machine: {result['machine']['cpu_cores']} CPU cores, {result['machine']['device_kind']}, jax "
    f"{result['machine']['jax']}.",
  ]
  return "\n".join(lines) + "\n"


def family_verdicts(result: Record) -> list[str]:
  """One line per method arm: whether it pays against the averaged anchor, and against its control; an
  arm whose method declares a control arm (`CONTROL`) that did not run says so (`missing_control`)."""
  lines = [verdict_rule("the averaged anchor"), ""]
  for m, f in result["figures"].items():
    a = f["averaged_baseline"]
    if not a.get("verdict"):
      continue
    line = f"* `{m}`: {pays_clause(a['verdict'], a['pass_ratio'], ' against the averaged anchor', figures=f)}"
    control = f.get("vs_skip_control")
    if control:
      line += f"; vs its control{' ' + control['control'] if control.get('control') else ''}: {paired_cell(control)}"
    elif missing := missing_control(result, m):
      line += f"; {missing}"
    lines.append(line)
  return lines


def missing_control(result: Record, name: str) -> str:
  """'no control arm ran (...)' for arm `name` of a family record when its method declares a `CONTROL`
  and the arm is no control itself, so that nothing credits the method only with what it adds to its
  control; '' otherwise (a method with no control arm, such as outer momentum, is compared with the
  anchors, its control), or where the record's arms or the method cannot be read here."""
  from hybridjax import registry
  from hybridjax.bench import arms as arms_lib
  from hybridjax.bench import record as record_lib

  try:
    arm = arms_lib.arms(record_lib.stored_config(result)).get(name)
    method = registry.load_method(arm.method) if arm is not None else None
  except (ValueError, KeyError, AttributeError):
    return ""
  if arm is None or arm.control or not (method and arms_lib.declared(method, "CONTROL")):
    return ""
  return (
    f"no control arm ran (method {arm.method!r} declares one: add an arm with control=True and "
    f"control_of={name!r}, or name the method's module in --config.benchmark.methods)"
  )


def save_plots(result: Record, outdir: str) -> list[str]:
  """Budget curves with the method points, the LR sweep and every arm's eval curve (one seed)."""
  # Each arm's backward passes (x) and final loss (y), mean and std over the seeds.
  points = {
    m: dict(zip(("x", "x_std", "y", "y_std"), f["backward_passes"] + f["final_loss"]))
    for m, f in result["figures"].items()
  }
  names = {"baseline": "baseline (raw)", "averaged_baseline": "averaged baseline"}
  title, seed = f"{result['preset']} {result['family']}", str(result["seeds"][0])
  arms = {"baseline (N)": result["budget_runs"][f"{seed}/{result['steps']}"]["curve"]}
  arms |= {m: runs[seed]["curve"] for m, runs in result["method_runs"].items()}
  return [
    plots.plot_budget_curves(
      os.path.join(outdir, "budget_curve.png"),
      result["budgets"],
      {names[a]: result["curves"][a] for a in ANCHORS},
      points,
      title=title + ": final eval loss against backward passes",
    ),
    plots.plot_lr_sweep(os.path.join(outdir, "lr_sweep.png"), result["tuning"]["rows"], title=title),
    plots.plot_arm_eval_curves(os.path.join(outdir, "eval_curves.png"), arms, title=f"{title}, seed {seed}"),
  ]


def write_results(result: Record, workdir: str, publish: str = "") -> list[str]:
  """Writes benchmark.json, headline.json, results.md and the plots into `workdir`, and copies them
  into `publish` when set (`publish_results`: refused where it holds another config's results, after
  `workdir` is written); returns the plots' paths."""
  for name, data in (("benchmark.json", result), ("headline.json", result["headline"])):
    with open(os.path.join(workdir, name), "w") as f:
      json.dump(data, f, indent=2)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(markdown(result))
  paths = save_plots(result, workdir)
  if publish:
    publish_results(result, workdir, publish, paths)
  return paths


def publish_results(result: Record, workdir: str, publish: str, plots: list[str]) -> None:
  """Copies the family's files from `workdir` (`write_results`'s, `plots` among them) into `publish`;
  a ValueError naming --config.benchmark.publish, copying nothing, where `publish` holds the results of
  another config (`config.check_publish`)."""
  try:  # another config's results there, or a folder that cannot be made
    family_config.check_publish(result["config"], publish)
    os.makedirs(publish, exist_ok=True)
  except (ValueError, OSError) as e:
    raise ValueError(f"{e}. Nothing was published; the results are in {workdir}") from None
  for name in [*family_config.PUBLISHED, *(os.path.basename(p) for p in plots)]:
    shutil.copy(os.path.join(workdir, name), os.path.join(publish, name))
