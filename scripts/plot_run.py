#!/usr/bin/env python
"""Draws a run's figures from its workdir, and optionally compares it with other runs.

  python scripts/plot_run.py runs/hyb                          # -> runs/hyb/plots/*.png
  python scripts/plot_run.py runs/hyb --out figs --compare runs/base

Single-run figures (hybridjax.plotting.save_run_figures): phase_timeline.png, memory.png and, for
hybrid runs whose method predicts, predicted_vs_realised.png and alpha_by_group.png; velocity_norms.png
for the velocity predictor. With --compare,
the comparison figures (eval_vs_time.png, eval_vs_backward.png, memory.png) of WORKDIR and the
other runs go to <out>/compare/. Prints the path of every file written.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a clone

from hybridjax import plotting  # noqa: E402


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("workdir", help="a run directory (holds metrics.jsonl)")
  parser.add_argument("--out", default=None, help="output folder (default: WORKDIR/plots)")
  parser.add_argument(
    "--compare", nargs="+", default=[], metavar="OTHER_WORKDIR", help="other run directories to compare WORKDIR with"
  )
  args = parser.parse_args(argv)
  try:
    out = args.out or os.path.join(args.workdir, "plots")
    paths = plotting.save_run_figures(args.workdir, out)
    if args.compare:
      runs = [plotting.load_run(w) for w in [args.workdir] + args.compare]
      paths += plotting.save_comparison_figures(runs, os.path.join(out, "compare"))
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for p in paths:
    print(p)
  return 0


if __name__ == "__main__":
  sys.exit(main())
