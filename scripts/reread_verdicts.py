"""The record of every published verdict's switch from the "2se" rule to the "t" rule (`protocol.verdict`):
docs/results/verdicts-reread.{json,md}.

  python scripts/reread_verdicts.py           # write the markdown from the json
  python scripts/reread_verdicts.py --check   # exit 1 where the table and the records disagree

The json was computed from the records as they were first published, under "2se", before they were
re-read under "t" (scripts/reread_results.py): per paired difference (a dict with its per-seed
`differences` and its `verdict`, found by `paired_differences`), its published word ("old"), its word
under "t" ("new"), p, df and the figures both were judged from. The records now hold the "t" words, so
the json is kept as the record of what changed, not recomputed; the check reads it against the records
as now published: each row's "new" word, p and df are what its record holds at its `where` (a record kept
as first written, whose differences name no rule, `protocol.rule_of`, still holds the "old" word); each
row's "old" word is what "2se" gives from the row's own figures with the eval error it was published
with; every paired difference a record holds has its row, but for a record first published under "t" (one
the table does not name, every difference of which names "t"), which had nothing to switch; the markdown is
`markdown` of the json.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
OUT = os.path.join(RESULTS, "verdicts-reread")

sys.path.insert(0, ROOT)

from hybridjax.bench import protocol  # noqa: E402


def published_records() -> list[str]:
  """Every published json under docs/results/ but the run caches (runs, no verdicts) and this table."""
  paths = sorted(glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True))
  return [p for p in paths if "run-cache" not in p and not p.startswith(OUT)]


def _label(parent: list[Any], i: int) -> str:
  item = parent[i]
  return str(item["name"]) if isinstance(item, dict) and "name" in item else f"[{i}]"


def paired_differences(x: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
  """(where, the dict) of every paired difference in a record, in the record's order."""
  out = []
  if isinstance(x, dict):
    if "differences" in x and "verdict" in x and "se" in x:
      out.append((where, x))
    for k, v in x.items():
      out += paired_differences(v, f"{where}.{k}" if where else str(k))
  elif isinstance(x, list):
    for i, v in enumerate(x):
      out += paired_differences(v, f"{where}.{_label(x, i)}" if where else _label(x, i))
  return out


def _num(x: float | None, fmt: str) -> str:
  return "—" if x is None else format(x, fmt)


def markdown(table: dict[str, Any]) -> str:
  """verdicts-reread.md: the flips first, then every verdict per record."""
  rows = [(path, r) for path, rs in table["files"].items() for r in rs]
  flips = [(path, r) for path, r in rows if r["old"] != r["new"]]
  gained = sum(r["old"] == "no difference" for _, r in flips)
  head = "| where | first published (2 se) | now published (t rule) | p | mean | se_total | df | se_eval from |"
  rule = "|---|---|---|---|---|---|---|---|"

  def line(r: dict[str, Any]) -> str:
    new = f"**{r['new']}**" if r["new"] != r["old"] else r["new"]
    total = float(np.hypot(r["se_seed"], r["se_eval"] or 0.0))
    return (
      f"| {r['where']} | {r['old']} | {new} | {_num(r['p'], '.3g')} | {r['mean']:+.4f} | {total:.4f} | "
      f"{_num(r['df'], '.1f')} | {r['se_eval_from']} |"
    )

  out = [
    "# Every published verdict, from the 2 se rule to the t rule",
    "",
    "The published tables (docs/results/) read every verdict under the t rule, as docs/benchmark.md's "
    '"Figures" states it (`protocol.verdict`), re-read from their records without training '
    "(`python scripts/reread_results.py`). They were first published under the 2 se rule ('lower' or 'higher' "
    "where |mean| > 2 se_total, with the study's paired per-batch error of two runs at N). This table is the "
    "record of that switch: per verdict, its word as first published, its word now, p and the figures both "
    "were judged from. se_eval is the windows' standard error of the seed-averaged difference where the "
    "record keeps both sides' per-window losses (se_eval from 'windows': a recipe's step against the step "
    "before, a variants pair, a knobs side, a family's 1.25N gain), else the record's paired per-batch error "
    "('record'). `python scripts/reread_verdicts.py --check` (and a test) checks it against the records as "
    "now published; a record kept as first written (`variants-fixes-long.as-written.json`) keeps its first "
    "words.",
    "",
    "Where a row ends in `verdict.paired`, it is an arm's (or a step's) loss against the anchor's curve at its "
    "cost, read as the anchor reads itself at N: 'lower' is published as 'pays', 'higher' as 'does not pay'.",
    "",
    f"{len(flips)} of {len(rows)} published verdicts changed under the t rule (in bold below): "
    f"{sum(r['new'] == 'no difference' for _, r in flips)} lose their direction (with 3 seeds and a small eval "
    "error t(0.975, df) is near 4.3 where the 2 se rule used 2), "
    f"{gained} gain{'s' if gained == 1 else ''} one (the windows' error of a seed-averaged "
    "difference is smaller than the record's error of two runs).",
    "",
    "## The verdicts that changed",
    "",
  ]
  if flips:
    out += ["| record | " + head[2:], "|---" + rule]
    out += [f"| {path} " + line(r) for path, r in flips]
  else:
    out.append("None.")
  for path, rs in table["files"].items():
    out += ["", f"## {path}", "", f"Eval batches: {rs[0]['eval_windows'] or 'not recorded (se_eval on ∞ df)'}.", ""]
    out += [head, rule] + [line(r) for r in rs]
  return "\n".join(out) + "\n"


def _close(a: float | None, b: float | None) -> bool:
  """Equal up to float rounding (the records' df and p are recomputed by the studies' code)."""
  if a is None or b is None:
    return a is b
  return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def disagreements(table: dict[str, Any]) -> list[str]:
  """Where the table and the records as now published disagree (`__doc__`); empty where they agree."""
  out = []
  files = table["files"]
  for path in published_records():
    rel = os.path.relpath(path, ROOT)
    with open(path) as f:
      found = dict(paired_differences(json.load(f)))
    if rel not in files and all(protocol.rule_of(d) == protocol.RULE for d in found.values()):
      continue  # first published under the rule: nothing of it switched
    rows = {r["where"]: r for r in files.get(rel, [])}
    if set(found) != set(rows):
      out.append(f"{rel}: differences {sorted(set(found) ^ set(rows))} are in one of the record and the table only")
    for where, r in rows.items():
      d = found.get(where)
      if d is None:
        continue
      first = protocol.verdict(r["mean"], r["se_seed"], r["n"], r["se_eval_published"], rule=protocol.UNMARKED_RULE)
      old = first["verdict"]
      if old != r["old"]:
        out.append(f"{rel} {where}: its published word {r['old']!r} is not what 2se gives ({old!r})")
      if protocol.rule_of(d) != protocol.RULE:
        if d["verdict"] != r["old"]:
          out.append(f"{rel} {where}: kept as first written, it reads {d['verdict']!r}, not {r['old']!r}")
        continue
      if d["verdict"] != r["new"] or not (_close(d["p"], r["p"]) and _close(d["df"], r["df"])):
        out.append(
          f"{rel} {where}: the record reads {d['verdict']!r} (p {d['p']}), the table {r['new']!r} (p {r['p']})"
        )
  gone = set(files) - {os.path.relpath(p, ROOT) for p in published_records()}
  out += [f"{rel}: no longer published" for rel in sorted(gone)]
  rows = [r for rs in files.values() for r in rs]
  if table["verdicts"] != len(rows) or table["flips"] != sum(r["old"] != r["new"] for r in rows):
    out.append("the table's counts are not its rows'")
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where the table and records disagree")
  args = parser.parse_args()
  with open(OUT + ".json") as f:
    table = json.load(f)
  problems = disagreements(table)
  text = markdown(table)
  with open(OUT + ".md") as f:
    stale = f.read() != text
  if stale and not args.check:
    with open(OUT + ".md", "w") as f:
      f.write(text)
  print(
    "\n".join(problems) if problems else f"{table['flips']} of {table['verdicts']} verdicts changed; the records agree"
  )
  if stale:
    print(f"{os.path.relpath(OUT, ROOT)}.md: {'stale' if args.check else 'written'}")
  if problems or (args.check and stale):
    sys.exit(1)


if __name__ == "__main__":
  main()
