"""Resuming a run: what of its training depends on `trainer.steps`, so that a resume with another
length is refused where it would change what is trained, and what a finished run asked again says.
`loop.train.resume_or_init` calls them.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from hybridjax import config as config_lib
from hybridjax import optim as optim_lib


def steps_dependence(config: ml_collections.ConfigDict) -> list[str]:
  """What of `config`'s training changes with `trainer.steps`, besides where it stops; empty when
  nothing does (then a run may be resumed with another `trainer.steps`):

  * the learning-rate schedule, when it decays over the run (`optim.decay_steps=0`) to a floor below
    the peak (`optim.min_lr_ratio < 1`); a schedule with its own `decay_steps`, or a constant one
    (after its warm-up, which `optim.warmup_steps` fixes), does not depend on it;
  * a hybrid run's method, whose steps receive the run's length (`HybridContext.total_steps`: the
    velocity predictor's progress feature, the jump's window; a user's method may read it).

  Muon's momentum warm-up and outer momentum count optimizer updates (`optim.*` fields, compared on
  resume like every other field), not the run's length."""
  o = config.optim
  found = []
  if not int(o.get("decay_steps", 0)) and float(o.get("min_lr_ratio", 0.0)) != 1.0:
    found.append(
      f"the learning-rate schedule ({o.get('schedule', 'cosine')} decay over --config.trainer.steps, since "
      "--config.optim.decay_steps=0)"
    )
  if config.get("mode") == "hybrid":
    found.append(
      f"method {config_lib.method_name(config)!r}, whose steps read the run's length (HybridContext.total_steps)"
    )
  return found


def _lr(optim: Any, total_steps: int, step: int) -> float:
  return float(optim_lib.learning_rate(optim_lib.make_schedule(optim, total_steps), step))


def steps_change_error(
  config: ml_collections.ConfigDict, saved_steps: int, step: int, workdir: str, *, finished: bool = False
) -> str | None:
  """The refusal of resuming a run of `saved_steps` (its checkpoint at `step`) with `config`'s
  `trainer.steps`, or None when the change is safe (the same value, or nothing depends on it,
  `steps_dependence`) or explicitly allowed (`resume='force'`). `finished`: the run had finished."""
  steps = int(config.trainer.steps)
  if steps == saved_steps:
    return None
  if step > steps:  # even with resume='force': there is no step left to train
    return (
      f"--workdir {workdir} holds a run of --config.trainer.steps={saved_steps} whose checkpoint is at step {step}, "
      f"past --config.trainer.steps={steps}: there is nothing to train. Use --config.trainer.steps={saved_steps} "
      "to resume it, or a new --workdir"
    )
  depends = steps_dependence(config)
  if not depends or config.resume == "force":
    return None
  if depends[0].startswith("the learning-rate schedule"):
    depends[0] += (
      f": the learning rate at step {step} would be {_lr(config.optim, steps, step):.4g} instead of "
      f"{_lr(config.optim, saved_steps, step):.4g}"
    )
  state = "finished its" if finished else f"stopped at step {step} of its"
  return (
    f"--workdir {workdir} holds a run that {state} {saved_steps} steps (--config.trainer.steps={saved_steps}); "
    f"this config asks for --config.trainer.steps={steps}. Resuming it would change, mid-run, "
    + "; and ".join(depends)
    + f". The run would then look like a clean {steps}-step run. Use --config.trainer.steps={saved_steps} to "
    f"resume it, a new --workdir to train {steps} steps from the start, or --config.resume=force to continue "
    f"with the schedule rebuilt for {steps} steps (recorded as steps_changes in the checkpoints and the summary)"
  )


def finished_message(config: ml_collections.ConfigDict, workdir: str, finished_steps: int) -> str:
  """What `train` prints for a run that has already finished its `finished_steps`: nothing to do,
  and how to train longer without silently changing its schedule."""
  steps = int(config.trainer.steps)
  asked = f" (--config.trainer.steps={steps} asks for no more)" if steps < finished_steps else ""
  if steps_dependence(config):
    longer = (
      "To train longer, use a new --workdir with a larger --config.trainer.steps: its schedule depends on "
      "the run's length, so continuing this run would change it mid-run"
    )
  else:
    longer = "Its schedule does not depend on the run's length: a larger --config.trainer.steps continues it"
  return f"{workdir} already finished its {finished_steps} steps{asked}; nothing to do. {longer}."
