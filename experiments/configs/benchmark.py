"""Benchmark configs: baseline vs hybrid vs the constant-alpha ablation, in one process.

  python -m experiments.benchmark                                          # tiny, CPU, < 15 min
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:quick   # < 2 min
  python -m experiments.benchmark --config=experiments/configs/benchmark.py:124m    # GPU

The experiment blocks (model, data, optim, trainer, hybrid) are the `gpt2_small` preset's, so the
benchmark trains exactly what `python -m experiments.gpt2_small` trains; `benchmark` holds the
comparison settings. Every run shares the data, seed, batch size, optimizer and step budget.
"""

from __future__ import annotations

import ml_collections

from experiments.configs import gpt2_small


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  """Returns the benchmark config for `preset` ('tiny', 'quick', 'small' or '124m')."""
  preset = preset or "tiny"
  if preset not in ("tiny", "quick", "small", "124m"):
    raise ValueError(
      f"unknown benchmark preset {preset!r}: use tiny, quick, small or 124m, e.g. "
      "--config=experiments/configs/benchmark.py:quick"
    )
  c = gpt2_small.get_config("tiny,micro" if preset == "quick" else preset)
  c.mode = "benchmark"  # informational: each run sets its own mode
  c.trainer.progress = False
  c.trainer.checkpoint_every = 0  # only the final checkpoint: saves are not what is measured
  # Host dispatch: each step's own program, so the cost of each phase is timed (step_cost); the
  # fused step runs every phase in one program and cannot tell them apart.
  c.hybrid.dispatch = "host"

  b = c.benchmark = ml_collections.ConfigDict()
  b.preset = preset
  b.runs = "baseline,hybrid,constant_alpha"  # comma-separated subset, run in this order
  b.repeats = 2  # each run this many times, interleaved (b,h,c,b,h,c); times are medians
  b.constant_alpha = 1.0  # the ablation's alpha for every predicted step
  b.switch_overhead = True  # also run scripts/bench_switch.py on this model (tiny/quick only)
  b.dynamics_timing_calls = 30  # timed calls of the dynamics model's train_step + imagine

  # Evaluate (on the same held-out batches for every run) often enough to locate when a run
  # reaches the target loss; logs line up with evals so each eval has a wall-clock time.
  c.trainer.eval_every = 25
  c.trainer.log_every = 25

  if preset == "quick":  # a smoke run for the tests: the whole pipeline in well under 2 minutes
    c.trainer.steps = 100
    c.trainer.batch_size = 8
    c.trainer.eval_batches = 2
    c.trainer.eval_every = c.trainer.log_every = 10
    c.optim.warmup_steps = 10
    c.hybrid.warmup_steps = 20
    c.hybrid.confidence_threshold = 0.0
    b.repeats = 1
    b.switch_overhead = False
    b.dynamics_timing_calls = 5
  elif preset == "124m":
    c.trainer.steps = 300
    c.trainer.eval_every = c.trainer.log_every = 25
    b.repeats = 1
    b.switch_overhead = False
  elif preset == "small":
    c.trainer.eval_every = c.trainer.log_every = 100
    b.repeats = 1
    b.switch_overhead = False
  return c
