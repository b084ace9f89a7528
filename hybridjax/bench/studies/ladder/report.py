"""The ladder's tables (ladder-<preset>.md), its verdicts and its plot."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hybridjax.bench import plots
from hybridjax.bench.cells import (
  BEYOND,
  compute_clause,
  eval_clause,
  eval_note,
  exercise_mark,
  mean_cell,
  paired_cell,
  pays_clause,
  pct_cell,
  ratio_cell,
  spread_note,
  verdict_cell,
  verdict_rule,
  wallclock_cell,
  with_exercise,
)
from hybridjax.bench.studies import Record
from hybridjax.bench.studies.ladder.rungs import VERDICT


def ladder_headline_cell(rung: Record, f: Record) -> str:
  """One arm at one rung, compact. R0: the seed's measure (the wall-clock ratio of N steps, the loss
  gap at N) and whether the arm's loss beats the nulls (both, or the stopped baseline alone for an arm
  with no control). R1-R5: the pass ratio (every forward charged), mean ± std over seeds, and the
  paired verdict at N against the arm's control, or against the baseline where it has none."""
  if rung["name"] == "R0":
    e = f["equal_steps"]
    compared = e["claim"]["nulls_compared"]
    which = "both nulls" if len(compared) == 2 else "the stopped baseline (no control)"
    beats = f"beats {which}" if e["claim"].get("beats_nulls_compared") else f"not beyond {which}"
    wall = mean_cell(e["wallclock_ratio"])
    wall += f" ({spread_note(e['wallclock_ratio'])})" if e["wallclock_ratio"] else ""
    return f"{wall}, {100 * e['final_loss_gap']['mean']:+.1f}%; {beats}"
  s = f["pass_ratio"]
  cell = "not reached" if s["mean"] is None else ratio_cell(s, f.get("verdict"))
  against = ("control", f["vs_control"]) if "vs_control" in f else ("baseline", f["vs_baseline_at_n"])
  return with_exercise(f"{cell}; vs {against[0]}: {verdict_cell(against[1])}", f)


def ladder_table(results: Sequence[Record]) -> str:
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


def ladder_scale(result: Record) -> str:
  """One line on what a scale ran: N, its rungs' seeds, the tuned LRs against the untuned one."""
  seeds = sorted({tuple(result["rungs"][r]["seeds"]) for r in result["rung_names"]})
  lrs = ", ".join(f"{r} {result['rungs'][r]['lr']:.3g}" for r in result["rung_names"])
  return (
    f"`{result['preset']}`: N = {result['steps']}, headline seeds {' / '.join(str(list(s)) for s in seeds)}, "
    f"peak LR by rung {lrs}; {compute_clause(result)}"
  )


def _losses(seeds: list[str], losses: list[float], plateau_seeds: set[str]) -> str:
  return ", ".join(f"{x:.4f}" + ("*" if s in plateau_seeds else "") for s, x in zip(seeds, losses))


def _verdict_words(result: Record) -> str:
  """'R4, R5 and R6 are the verdict': the rungs of `rungs.VERDICT` this ladder ran (`verdict_rungs`)."""
  ran = result.get("verdict_rungs") or [r for r in VERDICT if r in result["rung_names"]]
  if not ran:
    return f"No verdict rung ran ({', '.join(VERDICT)} are the verdict)"
  names = ran[0] if len(ran) == 1 else ", ".join(ran[:-1]) + " and " + ran[-1]
  return f"{names} {'is' if len(ran) == 1 else 'are'} the verdict"


def never_exercised(result: Record) -> str:
  """'; jump not exercised at any rung (at most 1.0 jumps per run, of 3 needed): its cells test nothing of
  it' for each arm whose figures mark it not exercised (`figures.exercise`) at every rung it ran, else ''
  (at `quick`: the jump arm, docs/benchmark.md "Not exercised")."""
  rungs = [result["rungs"][r] for r in result["rung_names"]]
  arms = dict.fromkeys(m for rung in rungs for m in rung["figures"])
  notes = []
  for m in arms:
    marks = [rung["figures"][m].get("exercise") for rung in rungs if m in rung["figures"]]
    if not marks or any(e is None or e["exercised"] for e in marks):
      continue
    unit = "jumps" if "jumps_per_run" in marks[0] else "predicted steps"
    most = max(e.get("jumps_per_run", e.get("predicted_steps_per_run", 0.0)) for e in marks)
    need = max(e["minimum"] for e in marks)
    notes.append(f"{m} not exercised at any rung (at most {most:.1f} {unit} per run, of {need:g} needed)")
  if not notes:
    return ""
  return "; " + "; ".join(notes) + f": {'its' if len(notes) == 1 else 'their'} cells test nothing of the method"


def ladder_markdown(result: Record) -> str:
  """ladder-<preset>.md: the headline table, then every rung's full figures with per-seed losses,
  the R0 nulls, the plateaus, the LR sweeps; its title says which arms no rung exercised (`never_exercised`)."""
  n = result["steps"]
  lines = [
    f"# The fairness ladder: preset `{result['preset']}` (task `{result['task']}`, N = {n}){never_exercised(result)}",
    "",
    f"Command: `{result['command']}`; wall time {result['wall_s']:.0f} s "
    f"({result['runs_trained']} runs trained, {result['runs_cached']} from the cache).",
    "",
    "Each cell: pass ratio (baseline steps to reach the arm's final loss, over the arm's backward passes",
    "plus its extra forwards at 1/3 each), mean ± std over the headline seeds, and the paired verdict of the",
    "arm's final loss at N against its control (or the baseline); at R0 the seed's own measure. "
    f"{_verdict_words(result)}: a tuned baseline that averages. 'no difference' = not {BEYOND}.",
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
      v, mark = f.get("verdict"), exercise_mark(f)
      arm = f"{m}, {mark}" if mark else m
      lines.append(
        f"| {arm} | {ratio_cell(f['backward_ratio'], v)} | {ratio_cell(f['pass_ratio'], v)} | "
        f"{wallclock_cell(f['wallclock_ratio'], v)} | {pct_cell(f['final_loss_gap'])} | "
        f"{paired_cell(f['vs_baseline_at_n'])} | {paired_cell(f.get('vs_control'))} | "
        f"{_losses(f['seeds'], f['loss'], flagged)} |"
      )
    first = next(iter(rung["figures"].values()), None)
    if first is not None:
      lines += ["", f"Baseline at N per seed: {_losses(first['seeds'], first['baseline_at_n'], flagged)}."]
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
          f"| {m} | {mean_cell(e['wallclock_ratio'])}"
          + (f"; {spread_note(e['wallclock_ratio'])}" if e["wallclock_ratio"] else "")
          + f" | {100 * g['mean']:+.2f}% | {e['within_2pct']} | "
          f"{mean_cell(stopped['wallclock_ratio'])} | {stopped['within_2pct']} | "
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


def ladder_verdicts(result: Record) -> list[str]:
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
      part = f"{r} {pays_clause(f['verdict'], f['pass_ratio'], '', figures=f)}"
      if f.get("vs_control"):
        part += f", vs its control: {paired_cell(f['vs_control'])}"
      parts.append(part)
    if parts:
      lines.append(f"* `{m}`: " + "; ".join(parts))
  return lines


def ladder_plot_data(result: Record) -> dict[str, Record]:
  """What the ladder figure draws: arm -> rung -> the per-seed ratio (R0: the equal-steps wall-clock
  ratio; the other rungs: the pass ratio)."""
  out: dict[str, Record] = {}
  for r in result["rung_names"]:
    for m, f in result["rungs"][r]["figures"].items():
      values = f["equal_steps"]["wallclock_per_seed"] if r == "R0" else f["pass_ratio"]["values"]
      out.setdefault(m, {})[r] = {"values": values}
  return out


def save_ladder_plot(result: Record, folder: str) -> str:
  return plots.plot_ladder(
    os.path.join(folder, f"ladder-{result['preset']}.png"),
    result["rung_names"],
    ladder_plot_data(result),
    result["verdict_rungs"],
    "speed-up (R0: wall-clock at N steps; the other rungs: pass ratio)",
  )
