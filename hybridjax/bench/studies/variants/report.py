"""The variants study's markdown: one row per pair, its losses and its paired difference."""

from __future__ import annotations

from hybridjax.bench import cells, protocol
from hybridjax.bench.studies import Record


def _settings(s: Record) -> str:
  return f"{s['lr']:.4g}, {s['iterate']}" + (" (grid edge)" if s.get("best_at_edge") else "")


def markdown(result: Record) -> str:
  """variants-<set>-<preset>.md, from the record alone."""
  n, seeds = result["steps"], ", ".join(map(str, result["seeds"]))
  if result.get("tuned"):
    how = (
      f"Each side is tuned as a step of the recipe is (its LR sweep on the tuning seeds, centred on the LR "
      f"the recipe tuned for its row in {result['lrs_from']}; its averaging beta and iterate), then runs N = {n} "
      f"steps on the headline seeds {seeds} at its best LR."
    )
  else:
    how = (
      f"Both sides run N = {n} steps on the headline seeds {seeds} at the LR, averaging beta and iterate the "
      f"recipe tuned for the pair's row ({result['lrs_from']}; a row it did not have takes the step at its place, "
      "or its last step past its list's end)."
    )
  lines = [
    f"# Recipe variants `{result['set']}` at `{result['preset']}`",
    "",
    f"Each pair starts from a row of the recipe (its tricks through that row) and differs in one change. {how} "
    f"after − before < 0: the change lowers the loss. A difference reads a direction only {cells.BEYOND}, the "
    "seeds' and the eval set's "
    "(the windows' error of the seed-averaged difference where both sides kept their per-window losses), p "
    f"beside each word; the table's resolution is {result['resolution']:.4f} (2 standard errors, the median "
    "over its pairs).",
    "",
    "| pair | row | change (after, for before) | before (LR, iterate) | after (LR, iterate) | after − before |",
    "|---|---|---|---|---|---|",
  ]
  for p in result["pairs"]:
    before, after = (
      f"{cells.pm(protocol.mean_std(p[k]))} ({_settings(p['settings'][k])})" for k in ("before", "after")
    )
    lines.append(
      f"| {p['name']} | {p['row']} | {p['what']} | {before} | {after} | {cells.paired_cell(p['difference'])} |"
    )
  rules = [f"* {p['name']}: {p['rule']}" for p in result["pairs"] if p.get("rule")]
  if rules:
    lines += ["", "Where one trick needs another:", *rules]
  added = result.get("seeds_added") or {}
  if added.get("seeds"):
    lines += [
      "",
      f"Seeds {added['seeds']} were added to both sides of {', '.join(added['pairs'])} (within twice the resolution).",
    ]
  lines += ["", "Losses are means ± std over the seeds; the code and library versions are in the json."]
  lines += ["", "## Verdicts", ""]
  lines += [cells.verdict_item(p["name"], p["difference"], "the change") for p in result["pairs"]]
  return "\n".join(lines)
