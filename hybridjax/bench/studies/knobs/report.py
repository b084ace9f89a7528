"""The knobs study's markdown: each side's knob sweeps, its tuning runs, and the headline difference
between the side as published and as tuned."""

from __future__ import annotations

from hybridjax.bench import cells, protocol
from hybridjax.bench.studies import Record
from hybridjax.bench.studies.knobs import curves

SIDE_NAMES = {"anchor": "the R4 anchor (AdamW)", "muon": "the recipe's Muon row", "recipe": "the whole recipe"}


def markdown(result: Record) -> str:
  """knobs-<preset>.md, from the record alone."""
  joint = result.get("tuner", "lr") == "joint"
  how = (
    "is searched by the joint search (`bench/search.py`: Sobol points over its space, the finalists on a third "
    "seed, its LR and edges refined, both sides at equal cost in N-run equivalents; each search in the json)"
    if joint
    else f"searches its own knobs one at a time on the tuning seeds {result['tuning_seeds']} (a value is kept "
    "where its mean loss at N is lower), then sweeps its LR again"
  )
  lines = [
    f"# Both sides tuned alike at `{result['preset']}`",
    "",
    f"Each side starts from the settings and LR of {result['lrs_from']} and {how}; then it runs "
    f"N = {result['steps']} steps on the headline seeds "
    f"{result['seeds']} as published and as tuned. tuned − published < 0: the tuning lowers the loss; a difference "
    f"reads a direction only {cells.BEYOND}, the seeds' and the eval windows' (of the seed-averaged difference), "
    "p beside each word.",
    "",
    f"| side | tuning runs{' (N-run equivalents)' if joint else ''} | tuned settings | published | tuned | "
    "tuned − published |",
    "|---|---|---|---|---|---|",
  ]
  for side, other in result.get("same_runs", {}).items():
    lines[-2:-2] = [
      f"At `{result['preset']}` {SIDE_NAMES.get(side, side)} is {SIDE_NAMES.get(other, other)} (the same config "
      "and knobs): its runs are the other's, trained once, and its rows repeat them.",
      "",
    ]
  for side, s in result["sides"].items():
    fields = ", ".join(f"{k}={v}" for k, v in s["tuned_fields"].items()) or "as published"
    fields += f"; LR {s['tuned_lr']:.4g} (published {s['published_settings']['lr']:.4g})"
    pub, tun = (cells.pm(protocol.mean_std(s[k])) for k in ("published", "tuned"))
    lines.append(
      f"| {SIDE_NAMES.get(side, side)} | {s['tuning_runs']} | {fields} | {pub} | {tun} | "
      f"{cells.paired_cell(s['difference'])} |"
    )
  # joint: no sweeps, the searches are the json's (`search`: every setting and run)
  for side, s in ({} if joint else result["sides"]).items():
    lines += [
      "",
      f"**{SIDE_NAMES.get(side, side)}**: each knob's sweep (value: mean loss at N on the tuning seeds; "
      "'as is': the value it had).",
      "",
    ]
    for sw in s["sweeps"]:
      values = ", ".join(f"{v}: {loss:.4f}" for v, loss in sw["values"].items())
      lines.append(f"* {sw['knob']}: {values} → {sw['chosen']}")
    values = ", ".join(f"{lr}: {loss:.4f}" for lr, loss in s["lr_sweep"].items())
    lines.append(f"* LR, again: {values}")
  if result["on_r4_curve"] is None:
    lines += [
      "",
      f"The recipe record's R4 curve holds none of the headline seeds {result['seeds']}: no side is read on it.",
    ]
  if result["on_r4_curve"]:
    lines += [
      "",
      "Each side's headline loss read on the R4 anchor's averaged budget curve from the same record (R4's steps "
      "to reach it, over N; '> x': below the curve's end, '< x': above its start)"
      + (f", on the seeds it holds, {result['on_r4_curve_seeds']}:" if "on_r4_curve_seeds" in result else ":"),
      "",
      "| side | published | tuned |",
      "|---|---|---|",
    ]
  for side, read in (result["on_r4_curve"] or {}).items():
    lines.append(f"| {SIDE_NAMES.get(side, side)} | {_speedup(read['published'])} | {_speedup(read['tuned'])} |")
  reproduced = result.get("anchor_reproduced")
  if reproduced is not None:
    same = [s for s, ok in reproduced.items() if ok]
    lines += [
      "",
      f"The anchor as published, re-run here, gives the recipe record's anchor loss at N bit for bit on seeds "
      f"{same or 'none'} of {list(reproduced)}"
      + ("." if len(same) == len(reproduced) else ": the record's curve is not this code's on the others."),
    ]
  lines += ["", "## Verdicts", ""]
  lines += [cells.verdict_item(side, s["difference"], "its tuning") for side, s in result["sides"].items()]
  return "\n".join(lines + curves.lines(result))


def _speedup(read: Record) -> str:
  """A reading on the anchor's curve as the recipe's table shows one: mean ± std, with its bound."""
  if read["mean"] is None:
    return "not reached"
  mark = "> " if read["lower_bound"] else "< " if read["upper_bound"] else ""
  return f"{mark}{read['mean']:.2f}× ± {read['std']:.2f} sd"
