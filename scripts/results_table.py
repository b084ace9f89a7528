"""The per-family results table of docs/results/README.md, generated from the published protocol runs.

  python scripts/results_table.py            # print the table
  python scripts/results_table.py --update   # rewrite it in docs/results/README.md (between the markers)
  python scripts/results_table.py --families # paired differences between families at N
  python scripts/results_table.py --cross=long-muon-cosine:long-adamw-cosine
      # one family's method arms against another family's anchors (labelled; never a headline)

Every row comes from `docs/results/<preset>-<family>/headline.json`, which
`python -m experiments.benchmark --config.benchmark.publish=docs/results/<preset>-<family>` writes;
tests/test_docs.py checks that the table in docs/results/README.md is this script's output.
`--families` compares each family's anchors with AdamW-cosine's on the same headline seeds, from the
published benchmark.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
README = os.path.join(RESULTS, "README.md")
START, END = "<!-- results-table:start -->", "<!-- results-table:end -->"
ANCHORS = ("baseline", "averaged_baseline")

sys.path.insert(0, ROOT)
from hybridjax.bench import cells, protocol  # noqa: E402


def load(kind: str = "headline.json") -> dict[str, dict]:
  """{folder name: parsed file} of every published result folder holding `kind`."""
  out = {}
  for path in sorted(glob.glob(os.path.join(RESULTS, "*", kind))):
    with open(path) as f:
      out[os.path.basename(os.path.dirname(path))] = json.load(f)
  return out


def _pm(pair, digits=4):
  return "n/a" if not pair or pair[0] is None else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f} sd"


def _ratio(h, key, anchor):
  value = h.get(key, {}).get(f"vs_{anchor}")
  if key not in h:
    return "—"
  if value is None:
    return "not reached"
  std = h.get(key + "_std", {}).get(f"vs_{anchor}")
  # [nulls, lower bounds, upper bounds]; a headline from before the upper bounds has two.
  null, bound, upper = ([*h.get(key + "_null_or_bound", {}).get(f"vs_{anchor}", [0, 0]), 0])[:3]
  notes = ([f"{null} not reached"] if null else []) + ([f"{bound} lower bounds"] if bound else [])
  notes += [f"{upper} upper bounds"] if upper else []
  prefix = "≤ " if upper and not bound else ""
  std_text = "" if std is None else f" ± {std:.2f} sd"
  return f"{prefix}{value:.2f}×{std_text}" + (f" ({', '.join(notes)})" if notes else "")


def _wallclock(h, anchor):
  """The wall-clock ratio with its spread over the timing rounds beside it (`cells.spread_note`: 'spread
  not recorded' for a headline whose timing kept no per-round times)."""
  cell = _ratio(h, "wallclock_ratio", anchor)
  if cell in ("—", "not reached"):
    return cell
  return f"{cell}; {cells.spread_note({'spread': h.get('wallclock_ratio_spread', {}).get(f'vs_{anchor}')})}"


def table(headlines: dict[str, dict]) -> str:
  head = (
    "| results | method | best LR | β | baseline at N | averaged baseline at N | method (averaged) | "
    "backward_ratio vs baseline / averaged | pass_ratio vs averaged | wallclock_ratio vs averaged | "
    "final loss vs averaged (verdict: t rule) |\n|---|---|---|---|---|---|---|---|---|---|---|"
  )
  rows = [head]
  for name, h in headlines.items():
    f = h["final_loss"]
    gap = h.get("final_loss_gap", {}).get("vs_averaged_baseline")
    verdict = h.get("paired_difference", {}).get("vs_averaged_baseline")
    mark = cells.exercise_mark(h)  # `figures.exercise`: too few jumps or predicted steps to test anything
    if mark:
      verdict += f"; {mark}"
    rows.append(
      f"| [{name}]({name}/results.md) | {h.get('method') or '—'} | {h['best_lr']:.3g} | "
      f"{h['averaging_beta']} | {_pm(f['baseline'])} | {_pm(f['averaged_baseline'])} | {_pm(f.get('method'))} | "
      f"{_ratio(h, 'backward_ratio', 'baseline')} / {_ratio(h, 'backward_ratio', 'averaged_baseline')} | "
      f"{_ratio(h, 'pass_ratio', 'averaged_baseline')} | {_wallclock(h, 'averaged_baseline')} | "
      + ("—" if gap is None else f"{100 * gap:+.2f}% ({verdict})")
      + " |"
    )
  return "\n".join(rows)


def family_differences(results: dict[str, dict], reference: str = "adamw-cosine") -> str:
  """Each family's final loss at N minus the reference family's, paired by headline seed."""
  lines = [
    "| family | best LR | anchor | final loss at N | minus " + reference + " (paired) |",
    "|---|---|---|---|---|",
  ]
  by_family = {(r["preset"], r["family"]): r for r in results.values()}
  for (preset, family), r in sorted(by_family.items()):
    ref = by_family.get((preset, reference))
    for anchor in ANCHORS:
      i = r["budgets"].index(r["steps"])
      seeds = sorted(r["curves"][anchor], key=int)
      mine = [r["curves"][anchor][s][i] for s in seeds]
      cell = "—"
      if ref is not None and family != reference and sorted(ref["curves"][anchor], key=int) == seeds:
        j = ref["budgets"].index(ref["steps"])
        d = protocol.paired_difference(mine, [ref["curves"][anchor][s][j] for s in seeds])
        cell = f"{d['mean']:+.4f} ± {d['se']:.4f} (se): {cells.verdict_word(d)}"
      lines.append(
        f"| {preset}-{family} | {r['tuning']['best_lr']:.3g} | {anchor} | {_pm(protocol.mean_std(mine))} | {cell} |"
      )
  return "\n".join(lines)


def cross_family(results: dict[str, dict], methods_from: str, anchors_from: str) -> str:
  """The method arms of `methods_from` judged against the anchors of `anchors_from` (same preset,
  same headline seeds): backward ratios and paired final-loss differences. Step times of two
  families were not measured in one process, so no wall-clock ratio."""
  from hybridjax.bench import figures  # jax and the library: only for this table

  m, a = results[methods_from], results[anchors_from]
  if m["steps"] != a["steps"] or m["seeds"] != a["seeds"]:
    raise SystemExit(f"{methods_from} and {anchors_from} differ in N or headline seeds")
  lines = [
    f"{methods_from} arms against the {anchors_from} anchors (a cross-family row, not a headline)",
    "",
    "| arm | backward_ratio vs baseline / averaged | final loss | minus averaged anchor at N (paired) |",
    "|---|---|---|---|",
  ]
  for method, runs in m["method_runs"].items():
    f = figures.method_figures(a["curves"], runs, None, a["budgets"])

    def cell(r):
      if r["mean"] is None:
        return "not reached"
      bound = f" ({r['n_lower_bound']} lower bounds: beyond the curve's 2N)" if r["n_lower_bound"] else ""
      return f"{r['mean']:.2f}×{bound}"

    ratios = " / ".join(cell(f[x]["backward_ratio"]) for x in ANCHORS)
    d = f["averaged_baseline"]["paired_difference"]
    lines.append(
      f"| {method} ({m['family']}) | {ratios} | {_pm(f['final_loss'])} | "
      f"{d['mean']:+.4f} ± {d['se']:.4f} (se): {cells.verdict_word(d)} |"
    )
  return "\n".join(lines)


def readme_block(text: str) -> str:
  """The table between the README's markers."""
  if START not in text or END not in text:
    raise SystemExit(f"docs/results/README.md lacks the markers {START} ... {END}")
  return text.split(START, 1)[1].split(END, 1)[0].strip()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--update", action="store_true", help="rewrite the table in docs/results/README.md")
  parser.add_argument("--families", action="store_true", help="paired differences between families at N")
  parser.add_argument(
    "--cross", default="", help="METHODS_FROM:ANCHORS_FROM result folders, e.g. long-muon-cosine:long-adamw-cosine"
  )
  args = parser.parse_args()
  if args.cross:
    methods_from, _, anchors_from = args.cross.partition(":")
    print(cross_family(load("benchmark.json"), methods_from, anchors_from))
    return
  if args.families:
    print(family_differences(load("benchmark.json")))
    return
  generated = table(load())
  if not args.update:
    print(generated)
    return
  with open(README) as f:
    text = f.read()
  old = readme_block(text)
  before, rest = text.split(START, 1)
  after = rest.split(END, 1)[1]
  text = f"{before}{START}\n{generated}\n{END}{after}"
  with open(README, "w") as f:
    f.write(text)
  print("docs/results/README.md: results table " + ("unchanged" if old == generated else "updated"))


if __name__ == "__main__":
  main()
