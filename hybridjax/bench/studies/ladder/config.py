"""The ladder's block of the benchmark config (`benchmark.ladder`) and its checks."""

from __future__ import annotations

import ml_collections

from hybridjax.bench import arms as arms_lib
from hybridjax.bench.studies.ladder.rungs import RUNGS, names, rungs_of


def add_defaults(block: ml_collections.ConfigDict, preset: str) -> None:
  """The ladder's fields (`benchmark.ladder`): every arm from a claim's own conditions (R0: equal
  steps, untuned constant LR) up to the tuned, averaged baselines (R4-R6)."""
  block.rungs = "R0,R1,R2,R3,R4,R5,R6"
  # methods, cosine_methods: the arms it runs name the experiment's arms, so they are set where
  # `benchmark.arms` is (experiments/configs/benchmark.py).
  block.untuned_lr = 1e-3  # the first Adam LR a user would try; R0/R1 hold it constant, R2's sweep starts at it
  block.constant_eval_points = 20  # evals over a constant LR's 2N run: its budget curve
  block.muon = ml_collections.ConfigDict({"name": "muon", "learning_rate": 0.02 if preset != "124m" else 0.01})  # R5


def validate(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Checks the ladder's fields; errors name the field and the fix. It trains no other config that
  needs a check of its own (its groups' are the config's with a schedule or an optimizer changed)."""
  ladder = config.benchmark.ladder
  errors = []
  bad = [r for r in rungs_of(config) if r not in RUNGS]
  if bad or not rungs_of(config):
    errors.append(f"--config.benchmark.ladder.rungs={ladder.rungs!r}: give rungs from {','.join(RUNGS)}")
  defined = arms_lib.arms(config)
  for field in ("methods", "cosine_methods"):
    unknown = [m for m in names(ladder[field]) if m not in defined]
    if unknown:
      errors.append(
        f"--config.benchmark.ladder.{field} names {unknown}, not arms of benchmark.arms ({','.join(defined)})"
      )
  if not float(ladder.untuned_lr) > 0:
    errors.append(f"--config.benchmark.ladder.untuned_lr must be > 0, got {ladder.untuned_lr}")
  if int(ladder.constant_eval_points) < 4:
    errors.append(
      "--config.benchmark.ladder.constant_eval_points must be >= 4 (eval points over a 2N constant run), "
      f"got {ladder.constant_eval_points}"
    )
  if errors:
    raise ValueError("; ".join(errors))
  return {}
