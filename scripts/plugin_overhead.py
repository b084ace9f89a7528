"""What the hybrid loop costs a plug-in method that uses none of it: a method whose real step is the
baseline's and which never predicts (`control` turns PREDICT off), timed against the plain baseline
in one process, step by step, in rounds that interleave the two (so a change in the machine's load
hits them alike). Reported: each side's median ms per step over the rounds, its spread (the
interquartile range of the rounds' medians), and the method's overhead over the baseline with its 95%
interval: a t interval over the rounds' paired ratios (each round times both sides, so each round's
ratio of their medians is one reading; `overhead_interval`).

The model, batch and optimizer are those of a benchmark preset's runs (`--preset`: `quick`, the
one-layer micro model, or `long`); the rounds and steps are this script's own (more than the
preset's `benchmark.timing_rounds`, so that an IQR over the rounds means something at `quick` too).

  python scripts/plugin_overhead.py                      # quick; 12 rounds of 25 steps each
  python scripts/plugin_overhead.py --preset=long
  python scripts/plugin_overhead.py --rounds=20 --steps=50

Run it on a quiet machine: it times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from typing import Any

import jax
import numpy as np

# A method of the user's that uses nothing of the hybrid loop: the baseline's real step (it defines
# no transitions), no state, and PREDICT turned off.
IDLE_METHOD = types.ModuleType("idle_method")
exec(  # noqa: S102 (a module written here, so the script stands alone)
  "NAME = 'idle'\n"
  "def make_settings(hybrid, *, groups):\n  return ()\n"
  "def init(ctx, params, rng):\n  return None\n"
  "def control(hybrid, settings):\n  return {'enable_predict': False}\n",
  IDLE_METHOD.__dict__,
)


PRESETS = ("quick", "long")  # the benchmark presets it times (experiments/configs/benchmark.py)


def _driver(preset: str, mode: str, steps: int) -> tuple[Any, Any, Any]:
  """The compiled side (`mode` baseline, or hybrid with the idle method) on `preset`'s experiment
  config, its initial state and `steps` batches."""
  from experiments import gpt2_small
  from experiments.configs import benchmark as benchmark_configs
  from hybridjax.bench import specs
  from hybridjax.loop import train as train_lib

  c = specs.experiment_config(benchmark_configs.get_config(preset))  # a preset's runs, less the benchmark block
  c.trainer.update(progress=False, compile_cache=False, compile_cache_dir="")
  c.mode = mode
  c.trainer.steps = 100_000  # the schedule: never at its end while timed
  if mode == "hybrid":
    c.hybrid.method = "idle_method"
  task = gpt2_small.build_task(c)
  driver = train_lib.make_driver(c, init_params=task.init_params, loss_fn=task.loss_fn)
  state = driver.init_state()
  batches = [task.train_batch(i) for i in range(steps)]
  return driver, state, batches


def overhead_interval(baseline_ms: list[float], method_ms: list[float]) -> tuple[float, float]:
  """The 95% interval of the method's overhead (its step time over the baseline's, less 1), from the rounds'
  paired ratios: a t interval of the mean log ratio over the rounds, as a ratio less 1."""
  from scipy import stats

  logs = np.log(np.asarray(method_ms) / np.asarray(baseline_ms))
  half = stats.t.ppf(0.975, len(logs) - 1) * float(np.std(logs, ddof=1)) / np.sqrt(len(logs))
  return float(np.expm1(logs.mean() - half)), float(np.expm1(logs.mean() + half))


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", choices=PRESETS, default="quick", help="the benchmark preset whose runs are timed")
  p.add_argument("--rounds", type=int, default=12)
  p.add_argument("--steps", type=int, default=25, help="steps per side and round")
  args = p.parse_args(argv)
  if args.rounds < 2 or args.steps < 1:
    p.error(f"--rounds={args.rounds} --steps={args.steps}: an IQR over the rounds needs --rounds >= 2 and --steps >= 1")
  sys.modules["idle_method"] = IDLE_METHOD
  sides = {
    "baseline": _driver(args.preset, "baseline", args.steps),
    "idle method": _driver(args.preset, "hybrid", args.steps),
  }
  states = {}
  for name, (driver, state, batches) in sides.items():  # compile, and a first step, untimed
    state, _ = driver.run(state, batches[:1])
    states[name] = jax.block_until_ready(state)
  per_round: dict[str, list[float]] = {name: [] for name in sides}
  for _ in range(args.rounds):
    for name, (driver, _, batches) in sides.items():
      times = []
      state = states[name]
      for batch in batches:
        t0 = time.perf_counter()
        state, _ = driver.run(state, [batch])
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
      states[name] = state
      per_round[name].append(1e3 * statistics.median(times))
  out: dict[str, Any] = {"preset": args.preset, "rounds": args.rounds, "steps": args.steps}
  for name, ms in per_round.items():
    q1, _, q3 = statistics.quantiles(ms, n=4)
    out[name] = {"median_ms": statistics.median(ms), "iqr_ms": q3 - q1}
  base, idle = out["baseline"]["median_ms"], out["idle method"]["median_ms"]
  out["overhead"] = idle / base - 1
  out["overhead_ci95"] = overhead_interval(per_round["baseline"], per_round["idle method"])
  print(f"preset {args.preset}: {args.rounds} interleaved rounds of {args.steps} steps per side")
  for name in sides:
    print(f"{name:12s} {out[name]['median_ms']:.3f} ms/step (IQR over the rounds {out[name]['iqr_ms']:.3f})")
  lo, hi = out["overhead_ci95"]
  print(
    f"overhead of the idle method: {100 * out['overhead']:+.1f}% (95% interval over the rounds' paired ratios "
    f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]{'' if lo > 0 or hi < 0 else ': it includes no overhead'})"
  )
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
