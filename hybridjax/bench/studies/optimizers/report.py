"""The optimizers study's table (optimizers-<cell>-<preset>.md)."""

from __future__ import annotations

import os
from typing import Any

from hybridjax.bench.studies.optimizers.figures import lr_edge, side_curves

BOUND = {None: "", "lower": "≥ ", "upper": "≤ ", "both": "bounded both ways: "}


def reading_cell(r: dict[str, Any]) -> str:
  """A reading: its geometric mean (a bound marked), its printed 95% interval and which it is."""
  lo, hi = r["ci95"]
  return f"{BOUND[r['bound']]}{r['mean']:.2f}× [{lo:.2f}, {hi:.2f}] ({r['interval']} interval)"


def corpus_name(corpus: dict[str, Any]) -> str:
  """A record's corpus as a page names it: a folder by its own name (the record keeps the path this machine
  read it from), the bundled one as the record names it."""
  name = str(corpus["name"])
  return os.path.basename(name.rstrip(os.sep)) if os.path.isabs(name) else name


def markdown(result: dict[str, Any]) -> str:
  """optimizers-<cell>-<preset>.md: the cell, both readings and the verdict, then each side's curve per seed."""
  cell, f = result["cell"], result["factor"]
  corpus = result["corpus"]
  epochs = (
    "" if corpus.get("max_epochs") is None else f", its longest run drawing {corpus['max_epochs']:.2f}× its tokens"
  )
  out = [
    f"# Muon over AdamW on one architecture: cell `{cell['name']}`, `{cell['preset']}`",
    "",
    f"Command: `{result['command']}`" if result.get("command") else "",
    "",
    f"N = {result['steps']} steps of {cell['batch'][0]} × {cell['batch'][1]} tokens; headline seeds {result['seeds']}, "
    f"re-checks on {result['tuning_seeds']}"
    + (f", the joint search on {result['search_seeds']}" if result.get("search_seeds") else "")
    + f"; corpus {corpus_name(corpus)} ({corpus.get('tokens')} training tokens{epochs}"
    + (f", content hash {corpus['content_hash'][:16]}" if corpus.get("content_hash") else "")
    + ").",
    "",
    "Each side on its own budget curve, fitted L = a_s + b (T/N)^-c (one level per seed), read at N inside the "
    "budgets run (a bound outside them). Reading (a): AdamW's steps to reach Muon's loss at N, over N. Reading "
    "(b): N over Muon's steps to reach AdamW's loss at N. Geometric means over the seeds; the wider of the "
    "bootstrap's (seeds and eval windows) and the t-interval's 95% intervals.",
    "",
    "| reading | factor [95%] | per seed |",
    "|---|---|---|",
  ]
  for name, label in (("a", "(a) AdamW's steps to Muon's loss at N / N"), ("b", "(b) N / Muon's steps to AdamW's")):
    r = f[name]
    out.append(f"| {label} | {reading_cell(r)} | {', '.join(f'{x:.2f}' for x in r['per_seed'])} |")
  raw = result.get("factor_raw")
  if raw:
    out.append(
      f"| the raw iterates': (a) | {reading_cell(raw['a'])} | {', '.join(f'{x:.2f}' for x in raw['a']['per_seed'])} |"
    )
    out.append(
      f"| the raw iterates': (b) | {reading_cell(raw['b'])} | {', '.join(f'{x:.2f}' for x in raw['b']['per_seed'])} |"
    )
  out += interpolated_lines(result) + ["", verdict_line(result), ""]
  out += ["| side | row | LR | beta (iterate) | budgets (× N) | per-budget settings | re-check runs (N-run eq.) |"]
  out += ["|---|---|---|---|---|---|---|"]
  for side, rec in result["sides"].items():
    s = rec["settings"]
    moved = {k: v for k, v in rec["per_budget"].items() if v != {"lr": s["lr"], "weight_decay": s["weight_decay"]}}
    out.append(
      f"| {side} | {s['row']} | {s['lr']:.4g} | {s['beta']} ({s['iterate']}) | {rec['budgets']} | "
      f"{moved or 'as published'} | {rec['measurement_runs']:.1f} |"
    )
  out += search_lines(result) + local_check_lines(result)
  out += ["", "| side | seed | loss per budget |", "|---|---|---|"]
  n = int(result["steps"])
  for side in result["sides"]:
    for s, c in side_curves(result, side).items():
      pts = ", ".join(f"{t / n:.3g} N: {x:.4f}" for t, x in zip(c["steps"], c["loss"]))
      out.append(f"| {side} | {s} | {pts} |")
  fits = f["fits"]
  out += [
    "",
    "Fits: " + "; ".join(f"{k} a = {v['a']:.4f}, b = {v['b']:.4f}, c = {v['c']:.3f}" for k, v in fits.items()) + ".",
  ]
  return "\n".join(out)


def verdict_line(result: dict[str, Any]) -> str:
  """The verdict: a record of today's readings against 1.0× (`factor.verdict_against_one`), with the field's
  range beside it; a published one as it was published, against 1.5×."""
  v = result.get("verdict_against_one")
  if not v:
    return f"Verdict against the field (reading (a)'s interval against 1.5×): **{result['verdict']}**."
  low, high = v["field"]
  return (
    f"Verdict against 1.0× (reading (a)'s 95% interval; the line declared before any seed was read): "
    f"**{v['verdict']}**; the smallest factor these seeds could tell from 1.0× at {v['power']:.0%} power: "
    f"{v['detectable']:.2f}×. Beside it, descriptively, the field's range {low:g}–{high:g}× (`field.json`): "
    f"the interval is {v['against_field']} it."
  )


def interpolated_lines(result: dict[str, Any]) -> list[str]:
  """Each reading fitted and model-free side by side (`factor.interpolated`), where the record holds both."""
  inter = result.get("interpolated")
  if not inter:
    return []
  out = ["", "| reading | fitted [95%] | interpolated [95% t] |", "|---|---|---|"]
  for name in ("a", "b"):
    i = inter[name]
    shown = f"{BOUND[i['bound']]}{i['mean']:.2f}× [{i['ci95_t'][0]:.2f}, {i['ci95_t'][1]:.2f}]"
    out.append(f"| ({name}) | {reading_cell(result['factor'][name])} | {shown} |")
  return out


def tuned_minus_published(rec: dict[str, Any]) -> dict[str, Any]:
  """The fields a side's search moved from its published setting: {field: [published, tuned]}."""
  settings, search = rec["settings"], rec["search"]
  published = next(s["config"] for s in search["settings"] if s["origin"] == "published")
  fields = settings["fields"]
  moved = {k: [published.get(k), fields.get(k)] for k in {**published, **fields} if published.get(k) != fields.get(k)}
  for k in ("beta", "iterate"):
    if settings["published"][k] != settings[k]:
      moved[k] = [settings["published"][k], settings[k]]
  return moved


def search_lines(result: dict[str, Any]) -> list[str]:
  """Cell `both_tuned`: each side's search cost (N-run equivalents) and what it moved."""
  searched = {side: rec for side, rec in result["sides"].items() if rec.get("search")}
  if not searched:
    return []
  out = ["", "| side | search runs (N-run eq.) | Sobol points | tuned − published |", "|---|---|---|---|"]
  for side, rec in searched.items():
    moved = ", ".join(f"{k}: {a} → {b}" for k, (a, b) in tuned_minus_published(rec).items()) or "nothing"
    out.append(f"| {side} | {rec['tuning_runs']:.1f} | {rec['search']['sobol_points']} | {moved} |")
  return out


def local_check_lines(result: dict[str, Any]) -> list[str]:
  """The carried cells: what each side's settings became (cell `small_batch`: converted from cell
  `both_tuned`'s to its batch), what the local check chose, and at the smaller batch where the larger one
  sits against the critical batch."""
  checked = {side: rec for side, rec in result["sides"].items() if rec.get("local_check")}
  if not checked:
    return []
  small = result["cell"]["name"] == "small_batch"
  how = (
    f"converted to {result['cell']['batch'][0]} windows per step at the same tokens (a decay per step d to "
    "d^(b/B), the warm-up's steps B/b times as many), then each side's LR at its sqrt(2) neighbours × beta2 "
    "{converted, unconverted}"
    if small
    else "unconverted, then each side's LR at its sqrt(2) neighbours"
  )

  def moves(k: int) -> str:
    return {0: "never", 1: "once", 2: "twice", 3: "three times", 4: "four times"}.get(k, f"{k} times")

  limit = list(
    {rec["local_check"]["lr_moves_limit"] for rec in checked.values() if "lr_moves_limit" in rec["local_check"]}
  )
  out = [
    "",
    f"Settings from {result['lrs_from']}, {how}, on the tuning seeds at N (the LR moved on by sqrt(2) steps while "
    "the best sat at the edge of those tried"
    + (f", at most {moves(limit[0])}" if len(limit) == 1 else "")
    + ": "
    + ", ".join(f"{side} {moves(rec['local_check']['lr_moves'])}" for side, rec in checked.items())
    + "):",
    "",
    "| side | local check runs (N-run eq.) | carried | chosen |",
    "|---|---|---|---|",
  ]
  for side, rec in checked.items():
    was = rec["settings"]["from"]
    moved = {k: f"{was['fields'][k]} → {v}" for k, v in rec["settings"]["fields"].items() if was["fields"][k] != v}
    if was["beta"] != rec["settings"]["beta"]:
      moved["beta"] = f"{was['beta']} → {rec['settings']['beta']}"
    carried = ", ".join(f"{k}: {v}" for k, v in moved.items()) or "as cell `both_tuned` chose"
    chosen = ", ".join(f"{k} = {v}" for k, v in rec["local_check"]["chosen"].items())
    out.append(f"| {side} | {rec['tuning_runs']:.1f} | {carried} | {chosen} |")
  for side, rec in checked.items():
    edge = lr_edge(rec["local_check"])
    if edge:
      out.append(
        f"\n{side}'s chosen LR is the {edge}est it tried, after the moves the check allows: a {edge}er LR may "
        f"do better: {side} may be under-tuned here, which would read the factor "
        + ("low" if side == "muon" else "high")
        + "."
      )
  if "critical_batch" in result:
    out += ["", "| side | loss at N tokens, this batch − cell `both_tuned`'s (paired seeds) | p | reading |"]
    out += ["|---|---|---|---|"]
    for side, d in result["critical_batch"].items():
      out.append(
        f"| {side} | {d['mean']:+.4f} ± {d['se_total']:.4f} se ({d['n']} seeds): {d['verdict']} | {d['p']:.3g} | "
        f"{d['reading']} |"
      )
  return out
