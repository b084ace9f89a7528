"""Re-runs one run of a published variants record on today's code, under the conditions a benchmark
worker runs it in (one CPU core, XLA:CPU on one thread), and says whether it gives the same bits.

  python scripts/rerun_variant.py init after 1      # pair, side, headline seed
  python scripts/rerun_variant.py relu2 before 2 --record=docs/results/recipe/variants-fixes-long.json

XLA:CPU's result depends on the cores the process may use (it partitions work by them), so the
script pins itself to one core before jax starts, as `bench.runs.worker.init_worker` does. It also
depends on the host CPU, and the published record does not name the machine kind its runs ran on: so
the script compares with the bits the published run's own code gave on this machine kind too, where
`tests/data/variant_rerun_numerics.json` records them (`same_bits_here`; null where it records none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MACHINE_RECORDS = os.path.join(ROOT, "tests", "data", "variant_rerun_numerics.json")


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("pair")
  p.add_argument("side", choices=("before", "after"))
  p.add_argument("seed")
  p.add_argument("--record", default=os.path.join(ROOT, "docs", "results", "recipe", "variants-fixes-long.json"))
  args = p.parse_args(argv)
  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  sys.path.insert(0, ROOT)
  from hybridjax.bench.runs.worker import worker_xla_flags

  os.environ["XLA_FLAGS"] = worker_xla_flags(os.environ.get("XLA_FLAGS", ""))
  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import specs
  from hybridjax.bench.runs import keys
  from hybridjax.bench.runs.anchor_run import run_anchor
  from hybridjax.bench.studies.variants.config import side_config
  from hybridjax.bench.studies.variants.sets import SETS

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from method_numerics import machine

  with open(args.record) as f:
    record = json.load(f)
  c = benchmark_cfg.get_config(record["preset"])
  c.benchmark.study, c.benchmark.variants.set = "variants", record["set"]
  pairs = {q["name"]: q for q in record["pairs"]}
  if args.pair not in pairs:
    p.error(f"pair {args.pair!r} is not in {args.record}; it has {', '.join(pairs)}")
  published_pair = pairs[args.pair]
  if args.seed not in published_pair["runs"][args.side]:
    p.error(f"seed {args.seed!r} has no run there; give one of {', '.join(published_pair['runs'][args.side])}")
  pair = {q.name: q for q in SETS[record["set"]].pairs}[args.pair]
  # The side's LR and beta as the record ran them: the recipe record its `lrs_from` named then may
  # since have been re-measured under the same path.
  row = published_pair["settings"][args.side]
  spec = specs.run_spec(
    side_config(c, pair, args.side),
    kind="anchor",
    seed=int(args.seed),
    lr=row["lr"],
    steps=int(c.trainer.steps),
    beta=row["beta"],
  )
  out = run_anchor(spec)
  published = published_pair["runs"][args.side][args.seed]
  same = out["final_raw"] == published["final_raw"] and out["final_averaged"] == published["final_averaged"]
  with open(MACHINE_RECORDS) as f:
    machine_records = json.load(f)
  here = [
    r
    for r in machine_records["records"]
    if r["machine"] == machine()
    and machine_records["run"] == {"pair": args.pair, "side": args.side, "seed": args.seed} | {"key": published["key"]}
  ]
  result = {
    "pair": args.pair,
    "side": args.side,
    "seed": args.seed,
    "key_today": keys.run_key(spec),
    "key_published": published["key"],
    "final_raw": [out["final_raw"], published["final_raw"]],
    "final_averaged": [out["final_averaged"], published["final_averaged"]],
    "same_bits": same,
    "machine": machine(),
    "recorded_here": [here[0]["final_raw"], here[0]["final_averaged"]] if here else None,
    "same_bits_here": (out["final_raw"] == here[0]["final_raw"] and out["final_averaged"] == here[0]["final_averaged"])
    if here
    else None,
  }
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
