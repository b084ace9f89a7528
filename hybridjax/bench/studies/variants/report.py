"""The variants study's markdown: one row per pair, its losses per seed and its paired difference."""

from __future__ import annotations

from typing import Any

from hybridjax.bench import cells, protocol


def markdown(result: dict[str, Any]) -> str:
  """variants-<set>-<preset>.md, from the record alone."""
  n, seeds = result["steps"], result["seeds"]
  lines = [
    f"# Recipe variants `{result['set']}` at `{result['preset']}`",
    "",
    f"Each pair starts from a row of the recipe (its tricks through that row), changes one thing, and runs "
    f"both sides N = {n} steps on the headline seeds {', '.join(map(str, seeds))} at the LR, averaging beta "
    f"and iterate the recipe tuned for the row ({result['lrs_from']}; a row it did not have takes the step "
    "at its place). after − before < 0: the change lowers the loss. Judged at 2 standard errors, the "
    "seeds' and the eval set's paired per-batch one.",
    "",
    "| pair | row (LR) | change (after, for before) | before | after | after − before |",
    "|---|---|---|---|---|---|",
  ]
  for p in result["pairs"]:
    s = p["settings"]
    lr = f"{p['row']} ({s['lr']:.4g}, {s['iterate']})"
    before, after = (cells.pm(protocol.mean_std(p[k])) for k in ("before", "after"))
    lines.append(f"| {p['name']} | {lr} | {p['what']} | {before} | {after} | {cells.paired_cell(p['difference'])} |")
  lines += ["", "Losses are means ± std over the seeds; the code version and library versions are in the json."]
  return "\n".join(lines)
