"""The report: results.md, the plots, the machine record, and the files a benchmark writes and
publishes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
from collections.abc import Sequence
from typing import Any

import jax

from hybridjax import plotting
from hybridjax.bench import protocol
from hybridjax.bench.figures import ANCHORS


def se_cell(d: dict[str, Any]) -> str:
  """A paired difference's mean ± the standard error it is judged with (the seeds' and the eval set's)."""
  return f"{d['mean']:+.4f} ± {d.get('se_total', d['se']):.4f} se"


def paired_cell(d: dict[str, Any] | None) -> str:
  return "—" if d is None else f"{se_cell(d)} ({d['verdict']})"


def eval_note(record: dict[str, Any] | None) -> str:
  """The sentence on what every difference of a study is judged with: the seeds' standard error and
  the eval set's paired per-batch one (`figures.eval_paired_se`), or why the latter is missing."""
  record = record or {}
  se, batches = record.get("paired_se"), record.get("batches")
  if se is not None:
    pair = record.get("budgets")
    of = f" (the anchor's {pair[0]}-step run against its {pair[1]}-step one, mean over the seeds)" if pair else ""
    source = f"; {record['source']}" if record.get("source") else ""
    return (
      f"Every difference is judged at 2 standard errors, the seeds' and the eval set's: a difference of two "
      f"runs scored on the same {batches} eval batches carries a sampling error of {se:.4f}, the paired "
      f"per-batch standard error{of}{source}."
    )
  if batches == 1:
    return (
      "The eval set's error of a difference cannot be estimated (one eval batch): every difference is judged "
      "on the seeds' spread alone."
    )
  return "The eval set's error of a difference was not recorded: every difference is judged on the seeds' spread alone."


def above_note(verdict: dict[str, Any] | None) -> str:
  """'anchor at N above its envelope: k/n seeds' where the anchor's own N-step loss lies above its curve
  (it then reads below 1x against itself, and so does an arm equal to it), else ''."""
  if not verdict:
    return ""
  above = verdict.get("anchor_above_envelope_at_n") or []
  k = sum(bool(x) for x in above)
  return f"anchor at N above its envelope: {k}/{len(above)} seeds" if k else ""


def pm(pair: Sequence[float] | None, digits: int = 4) -> str:
  if pair is None or pair[0] is None:
    return "n/a"
  return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def ratio_cell(s: dict[str, Any], verdict: dict[str, Any] | None = None) -> str:
  """A ratio's mean ± std over the seeds, with its notes: seeds not reached (a diverged run), lower
  bounds (below the curve's end), upper bounds (above its start: the mean reads '≤' where no seed is a
  lower bound), and, from the arm's `verdict` (`protocol.cost_verdict`), the seeds where the anchor's
  own N-step loss lies above its envelope."""
  above = above_note(verdict)
  if s["mean"] is None:
    return f"not reached ({s['n_null']}/{s['n']} seeds)" + (f" ({above})" if above else "")
  std = "" if s["std"] is None else f" ± {s['std']:.2f}"
  upper = s.get("n_upper_bound", 0)
  notes = []
  if s["n_null"]:
    notes.append(f"{s['n_null']} not reached")
  if s["n_lower_bound"]:
    notes.append(f"{s['n_lower_bound']} lower bounds")
  if upper:
    notes.append(f"{upper} upper bounds")
  if above:
    notes.append(above)
  prefix = "≤ " if upper and not s["n_lower_bound"] else ""
  return f"{prefix}{s['mean']:.2f}×{std}" + (f" ({', '.join(notes)})" if notes else "")


def pays_clause(verdict: dict[str, Any], ratio: dict[str, Any], against: str, cost: str = "its passes") -> str:
  """'**pays**' / '**does not pay**' / '**no difference**' with the ratio it reads, the loss difference
  it was judged on (`protocol.cost_verdict`) and the seeds where the anchor's N-step loss lies above its
  envelope."""
  parts = [f"{'pass ratio' if cost == 'its passes' else 'speed-up'} {ratio_cell(ratio)}{against}"]
  if verdict.get("paired"):
    parts.append(f"loss at {cost} {se_cell(verdict['paired'])} from the anchor's curve")
  else:
    parts.append("not judged: fewer than 2 seeds, or a cost outside the anchor's budgets")
  above = above_note(verdict)
  if above:
    parts.append(above)
  return f"**{verdict['verdict']}** ({'; '.join(parts)})"


def tuning_noise(t: dict[str, Any]) -> str:
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


def markdown(result: dict[str, Any]) -> str:
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
  lead = [x for x in a["averaging_lead_steps"]["per_seed"] if x is not None]
  upper = a["averaging_lead_steps"].get("upper_bound") or [False] * len(lead)
  lines += [
    "",
    "Averaging's lead at N, in baseline steps (per seed): "
    + ", ".join(
      "not reached" if x is None else ("≤ " if up else "") + f"{x:+.0f}"
      for x, up in zip(a["averaging_lead_steps"]["per_seed"], upper)
    )
    + (f" (mean {statistics.fmean(lead):+.0f})" if lead else "")
    + (
      "; lower bounds: " + str(a["averaging_lead_steps"]["lower_bound"])
      if any(a["averaging_lead_steps"]["lower_bound"])
      else ""
    )
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
      + "; ".join(f"{an} {se_cell(d)} → {d['verdict']}" for an, d in ph["budget_1.25N_vs_N"].items())
      + "."
    )
  lines.append(f"Eval set: {result['eval']['batches']} batches. {eval_note(result['eval'])}")
  methods = list(result["figures"])
  if methods:
    lines += ["", "## Method arms (headline seeds; ratios > 1 mean fewer than the anchor needs)", ""]
    lines.append("| figure | " + " | ".join(methods) + " |")
    lines.append("|---|" + "---|" * len(methods))

    def row(label, cell):
      lines.append(f"| {label} | " + " | ".join(cell(result["figures"][m], m) for m in methods) + " |")

    for an in ANCHORS:
      for key in ("backward_ratio", "pass_ratio", "wallclock_ratio"):
        row(f"{key} vs {an}", lambda f, m, an=an, key=key: ratio_cell(f[an][key], f[an].get("verdict")))
    for an in ANCHORS:
      row(
        f"final loss − {an} at N",
        lambda f, m, an=an: (
          f"{100 * f[an]['final_loss_gap']['mean']:+.2f}% ({f[an]['paired_difference']['verdict']})"
          if f[an]["paired_difference"]
          else f"{100 * f[an]['final_loss_gap']['mean']:+.2f}%"
        ),
      )
    row("final loss (its model: averaged)", lambda f, m: pm(f["final_loss"]))
    row("final loss of its raw params", lambda f, m: pm(f["final_loss_raw"]))
    row("backward passes", lambda f, m: pm(f["backward_passes"], 0))
    row("validation / probe forwards", lambda f, m: pm(f["validation_forwards"], 0))
    # The methods' own summary figures, one row each (e.g. the jump predictor's accepted jumps).
    stats = dict.fromkeys(k for f in result["figures"].values() for k in f.get("method_stats", []))
    for k in stats:
      row(k.replace("_", " "), lambda f, m, k=k: pm(f.get(k), 4) if f.get(k) else "")
    if any("vs_skip_control" in f for f in result["figures"].values()):
      row("final loss − control arm (paired)", lambda f, m: paired_cell(f.get("vs_skip_control")))
    ms = result["timing"]["ms_per_step"]
    row("median ms per step by kind", lambda f, m: ", ".join(f"{k} {v:.1f}" for k, v in sorted(ms[m].items())))
    lines.append("")
    lines.append(f"Baseline step: {ms['baseline']['baseline']:.2f} ms (median, interleaved).")
    lines += ["", "## Verdicts (against the averaged anchor)", "", *family_verdicts(result)]
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


def verdict_rule(anchor: str = "the anchor") -> str:
  """How a verdict line reads: when an arm pays against `anchor`."""
  return (
    f"An arm pays where its final loss lies below {anchor}'s curve at its passes (every forward at 1/3 of a "
    f"step) by more than 2 standard errors, read as {anchor} reads itself at N (so an arm equal to {anchor} "
    f"reads 'no difference' even where its N-step loss lies above its envelope); 'does not pay' where it "
    "lies above by as much."
  )


def family_verdicts(result: dict[str, Any]) -> list[str]:
  """One line per method arm: whether it pays against the averaged anchor, and against its control."""
  lines = [verdict_rule("the averaged anchor"), ""]
  for m, f in result["figures"].items():
    a = f["averaged_baseline"]
    if not a.get("verdict"):
      continue
    line = f"* `{m}`: {pays_clause(a['verdict'], a['pass_ratio'], ' against the averaged anchor')}"
    control = f.get("vs_skip_control")
    if control:
      line += f"; vs its control{' ' + control['control'] if control.get('control') else ''}: {paired_cell(control)}"
    lines.append(line)
  return lines


def save_plots(result: dict[str, Any], outdir: str) -> list[str]:
  """Budget curves with the method points, the LR sweep and every arm's eval curve (one seed)."""
  paths = []
  points = {
    m: {
      "x": f["backward_passes"][0],
      "x_std": f["backward_passes"][1],
      "y": f["final_loss"][0],
      "y_std": f["final_loss"][1],
    }
    for m, f in result["figures"].items()
  }
  names = {"baseline": "baseline (raw)", "averaged_baseline": "averaged baseline"}
  title = f"{result['preset']} {result['family']}"
  paths.append(
    plotting.plot_budget_curves(
      os.path.join(outdir, "budget_curve.png"),
      result["budgets"],
      {names[a]: result["curves"][a] for a in ANCHORS},
      points,
      title=title + ": final eval loss against backward passes",
    )
  )
  paths.append(plotting.plot_lr_sweep(os.path.join(outdir, "lr_sweep.png"), result["tuning"]["rows"], title=title))
  seed = str(result["seeds"][0])
  arms = {"baseline (N)": result["budget_runs"][f"{seed}/{result['steps']}"]["curve"]}
  for m, runs in result["method_runs"].items():
    arms[m] = runs[seed]["curve"]
  paths.append(
    plotting.plot_arm_eval_curves(os.path.join(outdir, "eval_curves.png"), arms, title=f"{title}, seed {seed}")
  )
  return paths


def earlier_invocations(path: str) -> list[dict[str, Any]]:
  """The invocations an earlier ladder or recipe recorded in its json at `path` (one resumed from
  its cache reports the compute of every invocation, not only its own); [] when there is none."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f).get("invocations", [])


def machine_info() -> dict[str, Any]:
  dev = jax.devices()[0]
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  return {
    "platform": dev.platform,
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "cpu_cores": cores,
    "python": platform.python_version(),
    "jax": jax.__version__,
    "machine": platform.machine(),
    "load_average_1m": os.getloadavg()[0],
  }


def write_results(result: dict[str, Any], workdir: str, publish: str = "") -> list[str]:
  """Writes benchmark.json, headline.json, results.md and the plots into `workdir`, and copies them
  into `publish` when set; returns the plots' paths."""
  with open(os.path.join(workdir, "benchmark.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(workdir, "headline.json"), "w") as f:
    json.dump(result["headline"], f, indent=2)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(markdown(result))
  plots = save_plots(result, workdir)
  if publish:
    os.makedirs(publish, exist_ok=True)
    for name in ["headline.json", "results.md", "benchmark.json"] + [os.path.basename(p) for p in plots]:
      shutil.copy(os.path.join(workdir, name), os.path.join(publish, name))
  return plots


def _mean_cell(s: dict[str, Any] | None, unit: str = "×", digits: int = 2) -> str:
  if s is None or s.get("mean") is None:
    return "—"
  std = "" if s.get("std") is None else f" ± {s['std']:.{digits}f}"
  return f"{s['mean']:.{digits}f}{unit}{std}"


def _pct(gap: dict[str, Any]) -> str:
  std = "" if gap.get("std") is None else f" ± {100 * gap['std']:.2f}"
  return f"{100 * gap['mean']:+.2f}%{std}"


def _verdict(d: dict[str, Any] | None) -> str:
  return "—" if d is None else d["verdict"]


def ladder_headline_cell(rung: dict[str, Any], f: dict[str, Any]) -> str:
  """One arm at one rung, compact. R0: the seed's measure (the wall-clock ratio of N steps, the loss
  gap at N) and whether the arm's loss beats the nulls (both, or the stopped baseline alone for an arm
  with no control). R1-R5: the pass ratio (every forward charged), mean ± std over seeds, and the
  paired verdict at N against the arm's control, or against the baseline where it has none."""
  if rung["name"] == "R0":
    e = f["equal_steps"]
    compared = e["claim"]["nulls_compared"]
    which = "both nulls" if len(compared) == 2 else "the stopped baseline (no control)"
    beats = f"beats {which}" if e["claim"].get("beats_nulls_compared") else f"not beyond {which}"
    return f"{_mean_cell(e['wallclock_ratio'])}, {100 * e['final_loss_gap']['mean']:+.1f}%; {beats}"
  s = f["pass_ratio"]
  cell = "not reached" if s["mean"] is None else ratio_cell(s, f.get("verdict"))
  against = ("control", f["vs_control"]) if "vs_control" in f else ("baseline", f["vs_baseline_at_n"])
  return f"{cell}; vs {against[0]}: {_verdict(against[1])}"


def ladder_table(results: Sequence[dict[str, Any]]) -> str:
  """The ladder's headline table: one row per scale and arm, one column per rung (R4-R5 marked the
  verdict); a rung a scale did not run is '—'."""
  order = list(dict.fromkeys(r for result in results for r in result["rung_names"]))
  first = {r: next(res["rungs"][r] for res in results if r in res["rungs"]) for r in order}
  head = [
    f"{r}: {first[r]['baseline']} ({first[r]['iterate']})" + (" **verdict**" if first[r]["verdict_rung"] else "")
    for r in order
  ]
  lines = ["| scale | arm | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(order)]
  for result in results:
    rungs = result["rungs"]
    arms = list(dict.fromkeys(m for r in result["rung_names"] for m in rungs[r]["figures"]))
    for m in arms:
      cells = [
        ladder_headline_cell(rungs[r], rungs[r]["figures"][m]) if r in rungs and m in rungs[r]["figures"] else "—"
        for r in order
      ]
      lines.append(f"| `{result['preset']}` | {m} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def compute_clause(result: dict[str, Any]) -> str:
  """What a published ladder or recipe cost: the runs its invocations trained and in how long, and
  how many more it read from the run cache (trained by a family's benchmark, or by an invocation
  that was stopped before it published: those runs' compute is not in the hours)."""
  calls = result.get("invocations") or [
    {"wall_s": result["wall_s"], "runs_trained": result["runs_trained"], "runs_cached": result.get("runs_cached", 0)}
  ]
  cached = sum(c.get("runs_cached", 0) for c in calls)
  return (
    f"{sum(c['runs_trained'] for c in calls)} runs trained in {sum(c['wall_s'] for c in calls) / 3600:.1f} h "
    f"over {len(calls)} invocation(s) on {result['machine'].get('cpu_cores', '?')} "
    f"{result['machine'].get('platform', 'cpu')} cores" + (f", {cached} more read from the run cache" if cached else "")
  )


def ladder_scale(result: dict[str, Any]) -> str:
  """One line on what a scale ran: N, its rungs' seeds, the tuned LRs against the untuned one."""
  seeds = sorted({tuple(result["rungs"][r]["seeds"]) for r in result["rung_names"]})
  lrs = ", ".join(f"{r} {result['rungs'][r]['lr']:.3g}" for r in result["rung_names"])
  return (
    f"`{result['preset']}`: N = {result['steps']}, headline seeds {' / '.join(str(list(s)) for s in seeds)}, "
    f"peak LR by rung {lrs}; {compute_clause(result)}"
  )


def _losses(f: dict[str, Any], plateau_seeds: set[str]) -> str:
  return ", ".join(f"{x:.4f}" + ("*" if s in plateau_seeds else "") for s, x in zip(f["seeds"], f["loss"]))


def ladder_markdown(result: dict[str, Any]) -> str:
  """ladder-<preset>.md: the headline table, then every rung's full figures with per-seed losses,
  the R0 nulls, the plateaus, the LR sweeps."""
  n = result["steps"]
  lines = [
    f"# The fairness ladder: preset `{result['preset']}` (task `{result['task']}`, N = {n})",
    "",
    f"Command: `{result['command']}`; wall time {result['wall_s']:.0f} s "
    f"({result['runs_trained']} runs trained, {result['runs_cached']} from the cache).",
    "",
    "Each cell: pass ratio (baseline steps to reach the arm's final loss, over the arm's backward passes",
    "plus its extra forwards at 1/3 each), mean ± std over the headline seeds, and the paired verdict of the",
    "arm's final loss at N against its control (or the baseline); at R0 the seed's own measure. R4 and R5",
    "are the verdict: a tuned baseline that averages. 'no difference' = inside 2 standard errors.",
    "",
    ladder_table([result]),
    "",
    ladder_scale(result) + ".",
    "",
    eval_note(next((result["rungs"][r].get("eval") for r in result["rung_names"]), None)),
    "",
  ]
  for name in result["rung_names"]:
    rung = result["rungs"][name]
    group = result["groups"][rung["group"]]
    flagged = {str(p["seed"]) for p in group["plateaus"]}
    lines += [
      f"## {name}: {rung['baseline']} ({rung['iterate']} iterate)" + (" — verdict" if rung["verdict_rung"] else ""),
      "",
      f"LR {rung['lr']:.4g}; seeds {rung['seeds']}"
      + (f"; claim reproduced: {rung['claim']}" if rung["claim"] else "")
      + f"; {eval_clause(rung.get('eval'))}",
      "",
      "| arm | backward ratio | pass ratio | wall-clock ratio | final loss gap at N | vs baseline at N "
      "| vs control | final loss per seed |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for m, f in list(rung["figures"].items()) + list(rung["controls"].items()):
      v = f.get("verdict")
      lines.append(
        f"| {m} | {ratio_cell(f['backward_ratio'], v)} | {ratio_cell(f['pass_ratio'], v)} | "
        f"{ratio_cell(f['wallclock_ratio'], v)} | {_pct(f['final_loss_gap'])} | "
        f"{paired_cell(f['vs_baseline_at_n'])} | {paired_cell(f.get('vs_control'))} | {_losses(f, flagged)} |"
      )
    first = next(iter(rung["figures"].values()), None)
    if first is not None:
      base = ", ".join(
        f"{x:.4f}" + ("*" if s in flagged else "") for s, x in zip(first["seeds"], first["baseline_at_n"])
      )
      lines += ["", f"Baseline at N per seed: {base}."]
    lines.append("")
    if name == "R0":
      lines += [
        "R0 as the seed measured it: N steps of the arm against N baseline steps. The claim counts only where the",
        "arm's loss is below both nulls: its control (the same decisions, no move) and the baseline stopped at",
        "the arm's backward passes (which 'speeds up' by N over those passes for free).",
        "",
        "| arm | wall-clock ratio, N steps | loss gap at N | within 2% (per seed) | stopped baseline: wall ratio "
        "| stopped baseline: within 2% | vs stopped baseline | vs control | speedup at ≤ 2% | beats both nulls |",
        "|---|---|---|---|---|---|---|---|---|---|",
      ]
      for m, f in rung["figures"].items():
        e = f["equal_steps"]
        g, stopped = e["final_loss_gap"], e["null_stopped_baseline"]
        lines.append(
          f"| {m} | {_mean_cell(e['wallclock_ratio'])} | {100 * g['mean']:+.2f}% | {e['within_2pct']} | "
          f"{_mean_cell(stopped['wallclock_ratio'])} | {stopped['within_2pct']} | "
          f"{paired_cell(e.get('vs_stopped_baseline'))} | "
          f"{paired_cell(e.get('vs_control'))} | {e['claim']['speedup_at_2pct']} | {e['claim']['beats_both_nulls']} |"
        )
      lines.append("")
  lines += ["## Plateau runs", ""]
  any_flagged = False
  for g, group in result["groups"].items():
    for p in group["plateaus"]:
      any_flagged = True
      lines.append(
        f"* {g}: {p['run']} seed {p['seed']}: {p['loss']:.4f} at step {p['at_step']} against its median over "
        f"seeds {p['median_over_seeds']:.4f}"
      )
    if group.get("extended_for_plateau"):
      lines.append(f"* {g}: seeds extended to {group['seeds']}")
  if not any_flagged:
    lines.append("None flagged (* marks a plateau seed in the tables above).")
  lines += ["", "## Learning rates", ""]
  cosine = result["groups"].get("cosine", {}).get("tuning")
  if cosine:
    lines.append(
      f"* R3 compares raw iterates at the LR tuned for the averaged one ({cosine['best_lr']:.4g}); the sweep's best "
      f"LR for the raw loss was {cosine['best_lr_for_raw_loss']:.4g}"
    )
  for g, group in result["groups"].items():
    if group.get("sweep", {}).get("best_at_edge") or group.get("tuning", {}).get("best_at_edge"):
      lines.append(f"* {g}: the best LR sits at the sweep grid's edge (raise benchmark.lr_max_extensions)")
  for g, pos in result["untuned_position"].items():
    lines.append(
      f"* {g}: grid {pos['grid']}, best {pos['best_lr']:.4g} ({pos['best_over_untuned']:.2f}× the untuned "
      f"{pos['untuned_lr']:.4g}, which lies {pos['untuned_vs_grid']})"
    )
  lines += ["", "## Verdicts", "", *ladder_verdicts(result)]
  return "\n".join(lines)


def eval_clause(record: dict[str, Any] | None) -> str:
  """A rung's eval error of a difference, in a few words."""
  se = (record or {}).get("paired_se")
  if se is None:
    return "eval error of a difference: " + (
      "cannot be estimated (one eval batch)" if (record or {}).get("batches") == 1 else "not recorded"
    )
  return f"eval error of a difference {se:.4f}" + (f" ({record['source']})" if record.get("source") else "")


def ladder_verdicts(result: dict[str, Any]) -> list[str]:
  """One line per arm: at each verdict rung (every rung but R0 where the ladder ran none), whether its
  pass ratio pays against the rung's baseline and how it compares with its control."""
  rungs = result["verdict_rungs"] or [r for r in result["rung_names"] if r != "R0"]
  arms = list(dict.fromkeys(m for r in rungs for m in result["rungs"][r]["figures"]))
  lines = [verdict_rule("the rung's baseline"), ""]
  for m in arms:
    parts = []
    for r in rungs:
      f = result["rungs"][r]["figures"].get(m)
      if f is None or not f.get("verdict"):
        continue
      part = f"{r} {pays_clause(f['verdict'], f['pass_ratio'], '')}"
      if f.get("vs_control"):
        part += f", vs its control: {paired_cell(f['vs_control'])}"
      parts.append(part)
    if parts:
      lines.append(f"* `{m}`: " + "; ".join(parts))
  return lines


def ladder_plot_data(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """What the ladder figure draws: arm -> rung -> the per-seed ratio (R0: the equal-steps wall-clock
  ratio; the other rungs: the pass ratio)."""
  out: dict[str, dict[str, Any]] = {}
  for r in result["rung_names"]:
    for m, f in result["rungs"][r]["figures"].items():
      values = f["equal_steps"]["wallclock_per_seed"] if r == "R0" else f["pass_ratio"]["values"]
      out.setdefault(m, {})[r] = {"values": values}
  return out


def save_ladder_plot(result: dict[str, Any], folder: str) -> str:
  return plotting.plot_ladder(
    os.path.join(folder, f"ladder-{result['preset']}.png"),
    result["rung_names"],
    ladder_plot_data(result),
    result["verdict_rungs"],
  )


def speedup_cell(s: dict[str, Any], verdict: dict[str, Any] | None = None) -> str:
  """A step's speed-up: mean ± std over seeds, '> x' where a seed's loss lies below the anchor's
  curve (a lower bound), '≤ x' where one lies above its start (an upper bound: the anchor's smallest
  budget already does better), 'not reached' for a diverged run; with the seeds where the anchor's own
  N-step loss lies above its envelope (`verdict`: the step's `protocol.cost_verdict`)."""
  if s["mean"] is None:
    return "not reached"
  prefix = "> " if s.get("lower_bound") else ("≤ " if s.get("upper_bound") else "")
  above = above_note(verdict)
  return prefix + _mean_cell(s) + (f" ({above})" if above else "")


def recipe_table(results: Sequence[dict[str, Any]]) -> str:
  """What trains faster: one row per step, one column per scale with the cumulative speed-up over
  the R4 anchor and the paired verdict against the previous step."""
  order = list(dict.fromkeys(r["name"] for res in results for r in res["figures"]))
  records = {r["name"]: r["record"] for res in results for r in res["figures"]}
  head = " | ".join(f"`{res['preset']}`: speed-up (vs previous step)" for res in results)
  lines = [f"| step | from the record | {head} |", "|---|---|" + "---|" * len(results)]
  for name in order:
    cells = []
    for res in results:
      row = next((r for r in res["figures"] if r["name"] == name), None)
      cells.append(
        "—"
        if row is None
        else f"{speedup_cell(row['speedup'], row.get('verdict'))} "
        f"({_verdict(row['vs_previous']) if row['vs_previous'] else 'anchor'})"
      )
    lines.append(f"| {name} | {records[name]} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def recipe_scale(result: dict[str, Any]) -> str:
  """One line on what a scale ran."""
  total = result["total_speedup"]
  wall = total.get("wallclock_ratio") or {}
  wall_text = f", {wall['mean']:.2f}× in wall-clock" if wall.get("mean") is not None else ""
  return (
    f"`{result['preset']}`: N = {result['steps']}, headline seeds {result['figures'][0]['seeds']}; the whole "
    f"recipe {speedup_cell(total)} fewer steps than R4{wall_text}; {compute_clause(result)}"
  )


def kept_lines(result: dict[str, Any]) -> list[str]:
  """The fields a recipe kept as given where a step's trick would have changed them (its `kept`:
  the command line's overrides), as a paragraph; none for a recipe that kept none."""
  kept = result.get("kept") or {}
  if not kept:
    return []
  steps = "; ".join(
    f"`{name}`: " + ", ".join(f"{field}={values[1]!r} (the trick's {values[0]!r})" for field, values in fields.items())
    for name, fields in kept.items()
  )
  return [f"Kept as given, not as the step's trick sets them (`benchmark.recipe_keep`): {steps}.", ""]


def recipe_markdown(result: dict[str, Any]) -> str:
  """recipe-<preset>.md: the table, then every step per seed (loss, speed-up, LR, iterate)."""
  out = [
    f"# The speedrun recipe, trick by trick: `{result['preset']}`",
    "",
    f"Command: `{result['command']}`" if result.get("command") else "",
    "",
    recipe_scale(result),
    "",
    *kept_lines(result),
    "Speed-up: the R4 anchor's (tuned AdamW, cosine, averaged) steps to reach the step's final loss, read "
    "on its averaged budget curve per seed, over N; '> x': below the curve's end. Wall-clock: the "
    "speed-up times the anchor's step time over the step's. Verdict: the paired difference of final "
    "losses against the previous step, 'lower'/'higher' beyond 2 se.",
    "",
    recipe_table([result]),
    "",
    eval_note(result["anchor"].get("eval")),
    "",
    "| step | loss per seed | speed-up per seed | wall-clock ratio | step ms | LR | iterate (beta) |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in result["figures"]:
    wall = r["wallclock_ratio"]
    out.append(
      f"| {r['name']} | {', '.join(f'{x:.4f}' for x in r['loss'])} | "
      f"{', '.join('—' if x is None else f'{x:.2f}' for x in r['speedup']['per_seed'])} | "
      f"{'—' if wall is None else format(wall['mean'], '.2f') + '×'} | "
      f"{'—' if wall is None else format(wall['step_ms'], '.1f')} | {r['lr']:.4g} | {r['iterate']} ({r['beta']}) |"
    )
  out += ["", f"The anchor's budgets: {result['anchor']['budgets']} steps."]
  out += ["", "## Verdicts", "", *recipe_verdicts(result)]
  return "\n".join(out)


def recipe_verdicts(result: dict[str, Any]) -> list[str]:
  """One line per step: whether its speed-up pays against the R4 anchor (its loss at N against the
  anchor's curve at N, read as the anchor reads itself), and how it compares with the step before."""
  lines = [
    "A step pays where its final loss at N lies below the anchor's curve at N by more than 2 standard errors, "
    "read as the anchor reads itself at N; 'does not pay' where it lies above by as much.",
    "",
  ]
  for r in result["figures"]:
    v = r.get("verdict")
    if not v:
      continue
    if r["vs_previous"] is None:
      lines.append(f"* anchor: speed-up {speedup_cell(r['speedup'], v)} against its own curve")
      continue
    lines.append(
      f"* {r['name']}: {pays_clause(v, r['speedup'] | speedup_counts(r['speedup']), ' over the R4 anchor', 'N')}"
      f"; against the step before: {paired_cell(r['vs_previous'])}"
    )
  return lines


def speedup_counts(s: dict[str, Any]) -> dict[str, Any]:
  """A speed-up's summary in the shape `ratio_cell` reads (counts of nulls and bounds)."""
  per_seed = s["per_seed"]
  return {
    "n": len(per_seed),
    "n_null": sum(x is None for x in per_seed),
    "n_lower_bound": s.get("n_lower_bound", int(bool(s.get("lower_bound")))),
    "n_upper_bound": s.get("n_upper_bound", int(bool(s.get("upper_bound")))),
  }


def save_recipe_plot(result: dict[str, Any], folder: str) -> str:
  return plotting.plot_recipe(
    os.path.join(folder, f"recipe-{result['preset']}.png"),
    [r["name"] for r in result["figures"]],
    [r["speedup"]["per_seed"] for r in result["figures"]],
    f"The speedrun recipe over R4, trick by trick: {result['preset']}",
  )


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
