#!/usr/bin/env python
"""The optimizers study's batch pilot: what a token costs at smaller batches, before cell `small_batch`
picks its batch (3 × 64 unless it costs more than 2× per token than 12 × 64).

  python scripts/batch_pilot.py    # writes docs/results/optimizers/batch-pilot.json (run it on a quiet machine)

One process on one core with one XLA thread, as a runner's worker: cell `both_tuned`'s AdamW side at
`long` (its published record's chosen settings), `--steps` steps at 12 × 64 and the same tokens at each
smaller batch, each run twice and timed the second time (the first compiles).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "docs", "results", "optimizers", "batch-pilot.json")


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=1000, help="steps at 12 x 64 (the others at the same tokens)")
  p.add_argument("--batches", default="12,6,4,3", help="the batches timed, the first the reference")
  p.add_argument("--out", default=OUT)
  args = p.parse_args(argv)
  import ml_collections

  from experiments.configs import benchmark as benchmark_cfg
  from hybridjax.bench import search, specs
  from hybridjax.bench.runs.anchor_run import run_anchor
  from hybridjax.bench.studies.optimizers.config import side_configs

  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
  c = benchmark_cfg.get_config("long")
  c.benchmark.study = "optimizers"
  _, sides = side_configs(c)
  with open(os.path.join(ROOT, "docs", "results", "optimizers", "optimizers-both_tuned-long.json")) as f:
    settings = json.load(f)["sides"]["adamw"]["settings"]
  adamw = search.apply_setting(sides["adamw"][0], settings["fields"])
  big = int(c.trainer.batch_size)
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  rows = []
  for b in (int(x) for x in args.batches.split(",")):
    cb = ml_collections.ConfigDict(adamw.to_dict())
    cb.trainer.batch_size, cb.trainer.eval_batches = b, int(c.trainer.eval_batches) * big // b
    steps = args.steps * big // b
    spec = specs.run_spec(cb, kind="anchor", seed=1, lr=settings["lr"], steps=steps, beta=0.995, betas=[0.995])
    seconds = []
    for _ in range(2):
      start = time.perf_counter()
      run_anchor(spec)
      seconds.append(time.perf_counter() - start)
    rows.append({"batch": [b, int(c.model.n_ctx)], "steps": steps, "seconds": seconds})
    print(f"{b} x {c.model.n_ctx}: {steps} steps, {seconds[1]:.1f} s (first, compiling: {seconds[0]:.1f} s)")
  ref = rows[0]["seconds"][1]
  for r in rows:
    r["cost_per_token"] = r["seconds"][1] / ref
  out = {
    "what": "seconds per run at the same tokens (the second of two runs; the first compiles), one core, one XLA thread",
    "command": "python scripts/batch_pilot.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    "load_before": load,
    "rows": rows,
  }
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
