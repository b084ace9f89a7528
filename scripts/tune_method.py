"""Method settings on the tuning seeds: variants of a method arm against the tuned anchor.

  python scripts/tune_method.py --config=long --method=jump \\
      --variant="k50-200:hybrid.jump.horizons=(50,100,200)" \\
      --variant="every50:hybrid.jump.every=50"
  python scripts/tune_method.py --config=long --method=outer_momentum --lr=3e-3,6e-3 \\
      --variant="K100:benchmark.arms.outer_momentum.overrides.optim.outer_every=100"

The benchmark protocol chooses a method's settings on the tuning seeds only: this runs each variant
(a name and `field=value` overrides of the benchmark config, `;`-separated) on both tuning seeds at
the family's tuned LR and averaging beta (read from `<workdir>/benchmark.json`, which a benchmark
of the family wrote; `--lr` runs other LRs too), through the benchmark's runner and run cache
(`<workdir>/cache`), and reports per seed: the final averaged loss, the difference from the anchor
at N on the same seed and LR (negative = better), backward passes, the gain in baseline steps read
on the tuning seed's own budget checks (0.5N, N, 2N at the tuned LR, averaged), and for jumps the
accepted jumps, the schedule steps they skipped and the mean persisting gain.

The headline seeds are never touched here.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from experiments.configs import benchmark as bench_cfg  # noqa: E402
from hybridjax.bench import plots, protocol  # noqa: E402
from hybridjax.bench import specs as bench_specs  # noqa: E402
from hybridjax.bench.runs.runner import make_runner  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict]:
  """'name:field=value;field=value' -> (name, {field: value}); values are Python literals."""
  name, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, (s.strip() for s in rest.split(";"))):
    field, _, value = item.partition("=")
    try:
      overrides[field.strip()] = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      overrides[field.strip()] = value.strip()
  return name.strip(), overrides


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="long", help="benchmark preset and family, e.g. long or long,muon")
  p.add_argument("--method", required=True, help="an arm of benchmark.arms")
  p.add_argument("--variant", action="append", default=[], help="name:field=value;field=value (repeatable)")
  p.add_argument("--lr", default="", help="comma-separated LRs (default: the family's tuned LR)")
  p.add_argument("--workdir", default="", help="the family's benchmark workdir (default: the benchmark's)")
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--out", default="", help="write the rows as JSON here")
  p.add_argument("--plot", default="", help="write the LR-robustness plot (loss vs LR, method and anchor) here")
  args = p.parse_args(argv)

  base = bench_cfg.get_config(args.config)
  variants = {}  # name -> its benchmark config, checked before anything is read or trained
  for name, overrides in [parse_variant(v) for v in args.variant] or [("default", {})]:
    c = bench_cfg.get_config(args.config)
    try:
      c.update_from_flattened_dict(overrides)
      bench_specs.validate_benchmark(c)
    except (KeyError, ValueError) as e:
      raise ValueError(f"--variant {name!r} ({overrides}): {e}") from e
    variants[name] = c
  workdir = args.workdir or os.path.join("runs", f"benchmark-{base.benchmark.preset}-{base.benchmark.family}")
  with open(os.path.join(workdir, "benchmark.json")) as f:
    tuning = json.load(f)["tuning"]
  lrs = [float(x) for x in args.lr.split(",")] if args.lr else [float(tuning["best_lr"])]
  beta = float(tuning["averaging_beta"])
  n = int(base.trainer.steps)

  specs, labels = [], []
  for name, c in variants.items():
    for lr in lrs:
      for seed in base.benchmark.tuning_seeds:
        spec = bench_specs.run_spec(c, kind="method", seed=int(seed), lr=lr, steps=n, beta=beta, method=args.method)
        specs.append(spec)
        labels.append((name, lr, int(seed)))
  # The anchors at N on the tuning seeds at these LRs (cached by the benchmark when it swept them).
  anchors = {
    (lr, int(s)): bench_specs.run_spec(
      base, kind="anchor", seed=int(s), lr=lr, steps=n, beta=float(base.benchmark.betas[0]), betas=base.benchmark.betas
    )
    for lr in lrs
    for s in base.benchmark.tuning_seeds
  }
  base.benchmark.workers = args.workers
  runner = make_runner(base, workdir)
  try:
    anchor_results = dict(zip(anchors, runner.run(list(anchors.values()), "anchors (tuning seeds, N)")))
    results = runner.run(specs, f"{args.method} variants (tuning seeds)")
  finally:
    runner.close()

  # The first tuning seed's budget checks at the tuned LR, and its anchor at N: a 3-point curve.
  best = float(tuning["best_lr"])
  points = {n: None}
  for factor, check in (tuning.get("budget_checks") or {}).items():
    for lr, loss in zip(check["lrs"], check["averaged_loss"]):
      if abs(lr - best) <= 1e-6 * best:
        points[round(float(factor) * n)] = float(loss)

  rows = []
  for (name, lr, seed), r in zip(labels, results):
    a = anchor_results[(lr, seed)]
    anchor_avg = float(a["final_averaged"][str(beta)] if str(beta) in a["final_averaged"] else a["final_averaged"][0])
    row = {
      "variant": name,
      "lr": lr,
      "seed": seed,
      "final_averaged": r["final_loss"],
      "anchor_averaged": anchor_avg,
      "difference": r["final_loss"] - anchor_avg,
      "backward_passes": r["backward_passes"],
      "forwards": r["validation_forwards"],
    }
    for k in ("jumps", "jump_attempts", "jump_steps", "mean_persisting_gain"):
      if k in r:
        row[k] = r[k]
    if seed == int(base.benchmark.tuning_seeds[0]) and abs(lr - best) <= 1e-6 * best:
      points[n] = anchor_avg
      budgets = sorted(b for b, v in points.items() if v is not None)
      reach = protocol.steps_to_reach(budgets, [points[b] for b in budgets], r["final_loss"])
      value = protocol.ratio(reach, r["backward_passes"])["value"]
      # Above the curve's start the ratio is an upper bound; below its end a lower bound.
      bound = "<= " if reach.upper_bound else (">= " if reach.lower_bound else "")
      row["backward_ratio"] = f"{bound}{value:.4g}" if bound else value
    rows.append(row)

  print(f"\n{args.method} on the tuning seeds, N = {n}, beta {beta} (difference: method - anchor, averaged)")
  for row in rows:
    extra = "".join(
      f" {k}={row[k]:.4g}" if isinstance(row[k], float) else f" {k}={row[k]}"
      for k in ("jumps", "jump_steps", "mean_persisting_gain", "backward_ratio")
      if row.get(k) is not None
    )
    print(
      f"  {row['variant']:<14} lr {row['lr']:.3g} seed {row['seed']}: {row['final_averaged']:.4f} "
      f"({row['difference']:+.4f}) backward {row['backward_passes']}{extra}"
    )
  by_variant: dict[tuple, list[float]] = {}
  for row in rows:
    by_variant.setdefault((row["variant"], row["lr"]), []).append(row["difference"])
  print("  mean difference over the tuning seeds:")
  for (name, lr), diffs in by_variant.items():
    print(f"    {name:<14} lr {lr:.3g}: {np.mean(diffs):+.4f} ({', '.join(f'{d:+.4f}' for d in diffs)})")
  if len(lrs) > 1:
    print(lr_table(rows, args.method))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)
  if args.plot:
    plots.plot_lr_robustness(rows, args.method, args.plot)
  return rows


def lr_table(rows: list[dict], method: str) -> str:
  """Markdown: per LR and tuning seed, the anchor's and the method's final averaged loss."""
  lines = [f"| LR | seed | anchor (averaged) | {method} (averaged) | difference |", "|---|---|---|---|---|"]
  for row in sorted(rows, key=lambda r: (r["variant"], r["lr"], r["seed"])):
    lines.append(
      f"| {row['lr']:.3g} | {row['seed']} | {row['anchor_averaged']:.4f} | {row['final_averaged']:.4f} "
      f"| {row['difference']:+.4f} |"
    )
  return "\n".join(lines)


if __name__ == "__main__":
  main()
