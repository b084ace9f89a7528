"""Re-reads every published verdict under the t rule (`protocol.verdict`, rule "t"), from the records as
committed, into one table: docs/results/verdicts-reread.{json,md}.

  python scripts/reread_verdicts.py           # write both files
  python scripts/reread_verdicts.py --check   # exit 1 when either differs from what the records give

Every paired difference a published json holds (a dict with its per-seed `differences` and its `verdict`:
a step against the one before, an arm against its anchor or its control, an arm's loss against the
anchor's curve at its cost, ...) is judged again: the seeds' standard error from its differences, the eval
error it was judged with (its `eval_se`: the study's paired per-batch error of two runs at N, mean over the
seeds; the records keep no per-window losses of both sides of most comparisons, so the windows' error of
the seed-averaged difference cannot be formed for them), on the file's eval batches - 1 df. The old word is
the one published; it is recomputed under the published rule ("2se") as a check that the table reads each
record as it was judged. The published tables keep their words (scripts/reread_results.py); this table
says which would change.
"""

from __future__ import annotations

import argparse
import glob
import json
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


def _ints(x: Any, key: str) -> list[int]:
  """Every int value of `key` anywhere in `x`."""
  if isinstance(x, dict):
    return [v for k, v in x.items() if k == key and isinstance(v, int)] + [i for v in x.values() for i in _ints(v, key)]
  if isinstance(x, list):
    return [i for v in x for i in _ints(v, key)]
  return []


def eval_windows(path: str, record: Any) -> int | None:
  """The eval batches a record's differences were scored on (its eval errors' `batches`, else its config's
  `eval_batches`; a family's headline.json: its benchmark.json's); None where it records none."""
  found = _ints(record, "batches") or _ints(record, "eval_batches")
  sibling = os.path.join(os.path.dirname(path), "benchmark.json")
  if not found and os.path.basename(path) != "benchmark.json" and os.path.exists(sibling):
    with open(sibling) as f:
      return eval_windows(sibling, json.load(f))
  if len(set(found)) > 1:
    raise SystemExit(f"{path}: eval batches {sorted(set(found))} differ within one record")
  return found[0] if found else None


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


def reread_one(d: dict[str, Any], windows: int | None) -> dict[str, Any]:
  """One published verdict, judged again from its per-seed differences under both rules."""
  diffs = np.asarray(d["differences"], dtype=np.float64)
  n = int(diffs.size)
  mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1) / np.sqrt(n))
  eval_se = d.get("eval_se")
  new = protocol.verdict(mean, se, n, eval_se, windows, rule="t")
  return {
    "old": d["verdict"],
    "old_recomputed": protocol.verdict(mean, se, n, eval_se, rule="2se")["verdict"],
    "new": new["verdict"],
    "p": new["p"],
    "df": new["df"],
    "mean": mean,
    "se_seed": se,
    "se_eval": eval_se,
    "n": n,
  }


def reread() -> dict[str, Any]:
  """The table: per published record, every verdict it holds, old and new."""
  files = {}
  for path in published_records():
    with open(path) as f:
      record = json.load(f)
    found = paired_differences(record)
    if not found:
      continue
    windows = eval_windows(path, record)
    files[os.path.relpath(path, ROOT)] = [
      {"where": where, "eval_windows": windows} | reread_one(d, windows) for where, d in found
    ]
  rows = [r for rs in files.values() for r in rs]
  return {
    "rule": "t: lower/higher where |mean| > t(0.975, df) se_total, se_total^2 = se_seed^2 + se_eval^2, df by "
    "Satterthwaite (se_seed on n - 1, se_eval on eval windows - 1); old: the published 2 se_total",
    "verdicts": len(rows),
    "flips": sum(r["old"] != r["new"] for r in rows),
    "files": files,
  }


def _num(x: float | None, fmt: str) -> str:
  return "—" if x is None else format(x, fmt)


def markdown(table: dict[str, Any]) -> str:
  """verdicts-reread.md: the flips first, then every verdict per record."""
  rows = [(path, r) for path, rs in table["files"].items() for r in rs]
  flips = [(path, r) for path, r in rows if r["old"] != r["new"]]
  head = "| where | published (2 se) | t rule | p | mean | se_total | df |"
  rule = "|---|---|---|---|---|---|---|"

  def line(r: dict[str, Any]) -> str:
    new = f"**{r['new']}**" if r["new"] != r["old"] else r["new"]
    total = float(np.hypot(r["se_seed"], r["se_eval"] or 0.0))
    return (
      f"| {r['where']} | {r['old']} | {new} | {_num(r['p'], '.3g')} | {r['mean']:+.4f} | {total:.4f} | "
      f"{_num(r['df'], '.1f')} |"
    )

  out = [
    "# Every published verdict under the t rule",
    "",
    "Generated by `python scripts/reread_verdicts.py` from the published records (docs/results/), no training.",
    "",
    "The rule: a paired difference over n seeds reads 'lower' or 'higher' where |mean| > t(0.975, df) se_total, "
    "else 'no difference'; se_total² = se_seed² + se_eval², se_seed = sd(d)/√n on n − 1 df, se_eval the eval "
    "error the record judged with (the study's paired per-batch error of two runs at N, mean over the seeds) on "
    "eval batches − 1 df, df by Satterthwaite. The published words used |mean| > 2 se_total; they stay in "
    "the published tables, which this table does not change.",
    "",
    "Where a row ends in `verdict.paired`, it is an arm's (or a step's) loss against the anchor's curve at its "
    "cost, read as the anchor reads itself at N: 'lower' is published as 'pays', 'higher' as 'does not pay'.",
    "",
    f"{len(flips)} of {len(rows)} published verdicts read otherwise under the t rule (in bold below). With 3 "
    "seeds and a small eval error, t(0.975, df) is near 4.3 where the published rule used 2.",
    "",
    "## The verdicts that change",
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a file would change")
  args = parser.parse_args()
  table = reread()
  texts = {OUT + ".json": json.dumps(table, indent=1) + "\n", OUT + ".md": markdown(table)}
  stale = []
  for path, text in texts.items():
    old = open(path).read() if os.path.exists(path) else None
    if old == text:
      continue
    stale.append(os.path.relpath(path, ROOT))
    if not args.check:
      with open(path, "w") as f:
        f.write(text)
  print(
    f"{table['flips']} of {table['verdicts']} verdicts change under the t rule; "
    + (f"{'stale' if args.check else 'written'}: {', '.join(stale)}" if stale else "the table is up to date")
  )
  if args.check and stale:
    sys.exit(1)


if __name__ == "__main__":
  main()
