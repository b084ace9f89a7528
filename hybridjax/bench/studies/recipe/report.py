"""The recipe's table (recipe-<preset>.md), its verdicts and its plot."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hybridjax.bench import comparison, plots
from hybridjax.bench.cells import (
  BEYOND,
  compute_clause,
  eval_note,
  paired_cell,
  pays_clause,
  speedup_cell,
  spread_note,
  verdict_cell,
)
from hybridjax.bench.speedrun import TRICK_LIST_VERSION
from hybridjax.bench.studies import Record


def recipe_table(results: Sequence[Record]) -> str:
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
        f"({verdict_cell(row['vs_previous']) if row['vs_previous'] else 'anchor'})"
      )
    lines.append(f"| {name} | {records[name]} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def recipe_scale(result: Record) -> str:
  """One line on what a scale ran."""
  total = result["total_speedup"]
  wall = total.get("wallclock_ratio") or {}
  wall_text = f", {wall['mean']:.2f}× in wall-clock ({spread_note(wall)})" if wall.get("mean") is not None else ""
  return (
    f"`{result['preset']}`: N = {result['steps']}, headline seeds {result['figures'][0]['seeds']}; the whole "
    f"recipe {speedup_cell(total)} fewer steps than R4{wall_text}; {compute_clause(result)}"
  )


def trick_list_lines(result: Record) -> list[str]:
  """For a recipe measured with an earlier trick list than today's, a paragraph that says so; none
  otherwise."""
  measured = int(result.get("trick_list", 1))
  if measured == TRICK_LIST_VERSION:
    return []
  return [
    f"Measured with trick list {measured}, before the fixes of list {TRICK_LIST_VERSION}: its steps are other "
    "changes than today's under the same names "
    "([what changed](../../recipe.md#what-changed-from-the-first-trick-list)).",
    "",
  ]


def kept_text(fields: dict[str, list]) -> str:
  """A step's fields kept as given: each field, its value and the trick's."""
  return ", ".join(f"{field}={values[1]!r} (the trick's {values[0]!r})" for field, values in fields.items())


def kept_lines(result: Record) -> list[str]:
  """The fields a recipe kept as given where a step's trick would have changed them (its `kept`:
  the command line's overrides), as a paragraph; none for a recipe that kept none."""
  kept = result.get("kept") or {}
  if not kept:
    return []
  steps = "; ".join(f"`{name}`: {kept_text(fields)}" for name, fields in kept.items())
  return [f"Kept as given, not as the step's trick sets them (`benchmark.recipe.keep`): {steps}.", ""]


def recipe_markdown(result: Record) -> str:
  """recipe-<preset>.md: the table, then every step per seed (loss, speed-up, LR, iterate)."""
  out = comparison.page_head(f"The speedrun recipe, trick by trick: `{result['preset']}`", result) + [
    recipe_scale(result),
    "",
    *trick_list_lines(result),
    *kept_lines(result),
    "Speed-up: the R4 anchor's (tuned AdamW, cosine, averaged) steps to reach the step's final loss, read "
    "on its averaged budget curve per seed, over N; '> x': below the curve's end. Wall-clock: the "
    "speed-up times the anchor's step time over the step's. Verdict: the paired difference of final "
    f"losses against the previous step, 'lower'/'higher' {BEYOND}.",
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
      f"{'—' if wall is None else format(wall['mean'], '.2f') + '×; ' + spread_note(wall)} | "
      f"{'—' if wall is None else format(wall['step_ms'], '.1f')} | {r['lr']:.4g} | {r['iterate']} ({r['beta']}) |"
    )
  out += ["", f"The anchor's budgets: {result['anchor']['budgets']} steps."]
  out += ["", "## Verdicts", "", *recipe_verdicts(result)]
  return "\n".join(out)


def recipe_verdicts(result: Record) -> list[str]:
  """One line per step: whether its speed-up pays against the R4 anchor (its loss at N against the
  anchor's curve at N, read as the anchor reads itself), and how it compares with the step before."""
  lines = [
    f"A step pays where its final loss at N lies below the anchor's curve at N {BEYOND}, "
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


def speedup_counts(s: Record) -> Record:
  """A speed-up's summary in the shape `ratio_cell` reads (counts of nulls and bounds)."""
  per_seed = s["per_seed"]
  return {
    "n": len(per_seed),
    "n_null": sum(x is None for x in per_seed),
    "n_lower_bound": s.get("n_lower_bound", int(bool(s.get("lower_bound")))),
    "n_upper_bound": s.get("n_upper_bound", int(bool(s.get("upper_bound")))),
  }


def save_recipe_plot(result: Record, folder: str) -> str:
  return plots.plot_recipe(
    os.path.join(folder, f"recipe-{result['preset']}.png"),
    [r["name"] for r in result["figures"]],
    [r["speedup"]["per_seed"] for r in result["figures"]],
    "speed-up over R4 (anchor steps to reach / N)",
    f"The speedrun recipe over R4, trick by trick: {result['preset']}",
  )
