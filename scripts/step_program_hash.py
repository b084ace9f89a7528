"""Prints a hash of the lowered StableHLO of the GPT-2 baseline train step at a preset (location
metadata stripped), so that two commits can be shown to compile the same program: the same hash means
the same step, so neither its numerics nor its speed can differ. Nothing is compiled or run.

  python scripts/step_program_hash.py                      # tiny and tiny,speedrun
  python scripts/step_program_hash.py tiny,micro 124m      # any presets
"""

from __future__ import annotations

import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from experiments.configs import gpt2_small as presets  # noqa: E402
from hybridjax import optim  # noqa: E402
from hybridjax.loop import baseline  # noqa: E402
from hybridjax.tasks import gpt2 as gpt2_task  # noqa: E402


def program_hash(preset: str) -> tuple[str, int]:
  """(the first 16 hex digits of the step's StableHLO's sha256, its line count) at `preset`."""
  c = presets.get_config(preset)
  task = gpt2_task.build_task(c).train_kwargs()
  tx = optim.make_optimizer(c.optim)
  params = jax.eval_shape(task["init_params"], jax.random.PRNGKey(0))
  state = jax.eval_shape(lambda p: optim.init_train_state(p, tx, 0.99), params)
  step = baseline.make_train_step(task["loss_fn"], tx, 1)
  text = step.lower(state, task["train_batch"](0), optim.make_schedule(c.optim, c.trainer.steps)).as_text()
  lines = [line.split(" loc(")[0] for line in text.splitlines() if not line.lstrip().startswith("#loc")]
  return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16], len(lines)


def main(argv: list[str]) -> int:
  for preset in argv or ["tiny", "tiny,speedrun"]:
    digest, n = program_hash(preset)
    print(f"{preset}: {digest} ({n} lines of StableHLO)")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
