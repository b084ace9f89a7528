"""Re-reads every published verdict under the t rule (`protocol.verdict`, rule "t"), from the records as
committed, into one table: docs/results/verdicts-reread.{json,md}.

  python scripts/reread_verdicts.py           # write both files
  python scripts/reread_verdicts.py --check   # exit 1 when either differs from what the records give

Every paired difference a published json holds (a dict with its per-seed `differences` and its `verdict`:
a step against the one before, an arm against its anchor or its control, an arm's loss against the
anchor's curve at its cost, ...) is judged again: the seeds' standard error from its differences, and the
windows' standard error of the seed-averaged difference where the record keeps both sides' per-window
losses (`window_pairs`), else the eval error it was judged with (its `eval_se`: the study's paired
per-batch error of two runs at N, mean over the seeds), on the eval batches - 1 df. The old word is
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


Windows = tuple[list[list[float]], list[list[float]]]


def _averaged_windows(runs: list[dict[str, Any]], iterate: str) -> list[list[float]] | None:
  """The runs' per-window losses where they are what the difference reads: the averaged iterate's."""
  if iterate != "averaged" or any("final_averaged_per_batch" not in r for r in runs):
    return None
  return [r["final_averaged_per_batch"] for r in runs]


def window_pairs(record: dict[str, Any]) -> dict[str, Windows]:
  """{where: (a's, b's per-window losses, per seed)} for each published difference a - b both of whose
  sides kept their per-window losses: a recipe's step against the step before, a variants pair (after -
  before), a knobs side (tuned - published), a family's 1.25N against its N (the averaged anchor)."""
  out: dict[str, Windows] = {}

  def put(where: str, a: list[list[float]] | None, b: list[list[float]] | None) -> None:
    if a is not None and b is not None:
      out[where] = (a, b)

  if "step_runs" in record and "figures" in record:  # a recipe: figures[0] is the anchor, kept no windows
    names = [f["name"] for f in record["figures"]]
    for prev, name in zip(names[1:], names[2:]):
      a, b = record["step_runs"][name], record["step_runs"][prev]
      seeds = sorted(a["runs"], key=int)
      put(
        f"figures.{name}.vs_previous",
        _averaged_windows([a["runs"][s] for s in seeds], a["iterate"]),
        _averaged_windows([b["runs"][s] for s in seeds], b["iterate"]),
      )
  for pair in record.get("pairs", []) if isinstance(record.get("pairs"), list) else []:  # variants
    if not {"seeds", "runs", "settings"} <= set(pair):  # a record as first written (`*.as-written.json`)
      continue
    seeds, runs, settings = pair["seeds"], pair["runs"], pair["settings"]
    put(
      f"pairs.{pair['name']}.difference",
      _averaged_windows([runs["after"][s] for s in seeds], settings["after"]["iterate"]),
      _averaged_windows([runs["before"][s] for s in seeds], settings["before"]["iterate"]),
    )
  for name, side in (record.get("sides") or {}).items():  # knobs
    if isinstance(side, dict) and {"published", "tuned"} <= set(side.get("runs", {})):
      put(
        f"sides.{name}.difference",
        _averaged_windows(side["runs"]["tuned"], side["tuned_read"]["iterate"]),
        _averaged_windows(side["runs"]["published"], side["published_settings"]["iterate"]),
      )
  gain = (record.get("phenomena") or {}).get("budget_1.25N_vs_N")
  if gain and "budget_runs" in record:  # a family: the averaged anchor's 1.25N run against its N run
    n, seeds = record["steps"], sorted(record["curves"]["averaged_baseline"], key=int)
    runs = record["budget_runs"]
    put(
      "phenomena.budget_1.25N_vs_N.averaged_baseline",
      _averaged_windows([runs[f"{s}/{round(1.25 * n)}"] for s in seeds], "averaged"),
      _averaged_windows([runs[f"{s}/{n}"] for s in seeds], "averaged"),
    )
  return out


def windows_se(d: dict[str, Any], windows: Windows | None) -> tuple[float, int] | None:
  """(the windows' standard error of the seed-averaged difference, the windows) where both sides' per-window
  losses are stored and give the published per-seed differences (their means, to float32 rounding); else None."""
  if windows is None:
    return None
  a, b = (np.asarray(x, dtype=np.float64) for x in windows)
  if a.shape != b.shape or a.shape[0] != len(d["differences"]):
    return None
  if not np.allclose((a - b).mean(axis=1), d["differences"], rtol=0, atol=1e-5):
    return None
  return protocol.seed_averaged_window_se(a, b), int(a.shape[1])


def reread_one(d: dict[str, Any], windows: int | None, per_window: Windows | None = None) -> dict[str, Any]:
  """One published verdict, judged again from its per-seed differences under both rules: the published one
  with the eval error it was judged with, the t rule with the windows' error of the seed-averaged difference
  where both sides' per-window losses are stored (`windows_se`), else with the same."""
  diffs = np.asarray(d["differences"], dtype=np.float64)
  n = int(diffs.size)
  mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1) / np.sqrt(n))
  eval_se = d.get("eval_se")
  own = windows_se(d, per_window)
  se_eval, count = own if own is not None else (eval_se, windows)
  new = protocol.verdict(mean, se, n, se_eval, count, rule="t")
  return {
    "old": d["verdict"],
    "old_recomputed": protocol.verdict(mean, se, n, eval_se, rule="2se")["verdict"],
    "new": new["verdict"],
    "p": new["p"],
    "df": new["df"],
    "mean": mean,
    "se_seed": se,
    "se_eval": se_eval,
    "se_eval_from": "windows" if own is not None else "record",
    "se_eval_published": eval_se,
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
    windows, pairs = eval_windows(path, record), window_pairs(record)
    files[os.path.relpath(path, ROOT)] = [
      {"where": where, "eval_windows": windows} | reread_one(d, windows, pairs.get(where)) for where, d in found
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
  gained = sum(r["old"] == "no difference" for _, r in flips)
  head = "| where | published (2 se) | t rule | p | mean | se_total | df | se_eval from |"
  rule = "|---|---|---|---|---|---|---|---|"

  def line(r: dict[str, Any]) -> str:
    new = f"**{r['new']}**" if r["new"] != r["old"] else r["new"]
    total = float(np.hypot(r["se_seed"], r["se_eval"] or 0.0))
    return (
      f"| {r['where']} | {r['old']} | {new} | {_num(r['p'], '.3g')} | {r['mean']:+.4f} | {total:.4f} | "
      f"{_num(r['df'], '.1f')} | {r['se_eval_from']} |"
    )

  out = [
    "# Every published verdict under the t rule",
    "",
    "Generated by `python scripts/reread_verdicts.py` from the published records (docs/results/), no training.",
    "",
    "The rule: a paired difference over n seeds reads 'lower' or 'higher' where |mean| > t(0.975, df) se_total, "
    "else 'no difference'; se_total² = se_seed² + se_eval², se_seed = sd(d)/√n on n − 1 df, se_eval on eval "
    "windows − 1 df, df by Satterthwaite. se_eval is the windows' standard error of the seed-averaged "
    "difference where the record keeps both sides' per-window losses (se_eval from 'windows': a recipe's step "
    "against the step before, a variants pair, a knobs side, a family's 1.25N gain), else the eval error the "
    "record judged with (the study's paired per-batch error of two runs at N, mean over the seeds: 'record'). "
    "The published words used |mean| > 2 se_total with the record's error; they stay in the published "
    "tables, which this table does not change.",
    "",
    "Where a row ends in `verdict.paired`, it is an arm's (or a step's) loss against the anchor's curve at its "
    "cost, read as the anchor reads itself at N: 'lower' is published as 'pays', 'higher' as 'does not pay'.",
    "",
    f"{len(flips)} of {len(rows)} published verdicts read otherwise under the t rule (in bold below): "
    f"{sum(r['new'] == 'no difference' for _, r in flips)} lose their direction (with 3 seeds and a small eval "
    "error t(0.975, df) is near 4.3 where the published rule used 2), "
    f"{gained} gain{'s' if gained == 1 else ''} one (the windows' error of a seed-averaged "
    "difference is smaller than the record's error of two runs).",
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
