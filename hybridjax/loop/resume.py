"""Resuming a run: the latest checkpoint of a workdir or a fresh state (`resume_or_init`), refused
where the config or the run's own code changed (`check_code`), or where another `trainer.steps`
would change what is trained (`steps_dependence`, `steps_change_error`); what a finished run asked
again says (`finished_message`). `loop.train.train` calls `resume_or_init`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from hybridjax import checkpoint as ckpt_lib
from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax import sharding as sharding_lib
from hybridjax.loop import fingerprint as fingerprint_lib


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
  longer = (
    "To train longer, use a new --workdir with a larger --config.trainer.steps: its schedule depends on "
    "the run's length, so continuing this run would change it mid-run"
    if steps_dependence(config)
    else "Its schedule does not depend on the run's length: a larger --config.trainer.steps continues it"
  )
  return f"{workdir} already finished its {finished_steps} steps{asked}; nothing to do. {longer}."


def resume_or_init(
  config: ml_collections.ConfigDict, workdir: str, driver: Any, manager: Any, code: dict[str, Any]
) -> tuple[Any, tuple[int, int], dict | None, dict[str, list]]:
  """(state, (start step, batches used), finished run's summary or None, what the run records of its
  resumes: {'steps_changes': ..., 'code_changes': ...}, each where it holds any): the latest
  checkpoint in `workdir` if `config.resume` allows it, else a fresh state. Refuses, changing
  nothing, a run with another config or whose own code changed (`code`: `fingerprint.fingerprint`
  of this run; see `check_code`), unless resume='force'; another `trainer.steps` where the training
  depends on it (`steps_change_error`), or an inconsistent checkpoint.

  A finished run is returned as finished when this config asks for no more steps than it trained.
  `steps_changes`: each resume with another `trainer.steps` under resume='force', as
  {"step", "from", "to"}, carried in every checkpoint's metadata and the summary."""
  latest = manager.latest_step()
  if latest is None:
    state = driver.init_state()
    if driver.mesh is None:
      # Committed to the device, as a restored state is: a fresh and a resumed run then lower to the
      # same programs (and a resumed run hits the persistent compilation cache).
      state = jax.device_put(state, jax.devices()[0])
    return state, (0, 0), None, {}
  if config.resume == "never":
    raise ValueError(
      f"--workdir {workdir} already holds a run (checkpoint at step {latest}); "
      "use a new --workdir, or --config.resume=auto to resume it."
    )
  meta = ckpt_lib.read_meta(manager, latest)
  diffs = ckpt_lib.config_differences(meta.get("config", {}), config)
  if diffs and config.resume != "force":
    raise ValueError(
      f"--workdir {workdir} holds a run with a different config:\n  "
      + "\n  ".join(diffs)
      + "\nUse a new --workdir, or pass --config.resume=force to resume it anyway."
    )
  # trainer.steps may differ (a runtime field) only where nothing but the end depends on it.
  saved = config_lib.flatten(meta.get("config", {}))
  saved_steps = int(saved.get("trainer.steps", config.trainer.steps))
  summary_path = os.path.join(workdir, "summary.json")
  start_step, has_summary = int(meta["step"]), os.path.exists(summary_path)
  finished = start_step >= saved_steps and has_summary
  done = start_step >= config.trainer.steps and has_summary  # nothing left to train
  code_changes = check_code(config, workdir, meta, code, trains=not done)
  if not (finished and done):
    error = steps_change_error(config, saved_steps, start_step, workdir, finished=finished)
    if error:
      raise ValueError(error)
  # Restored onto this run's shardings, whatever mesh shape the checkpoint was saved from.
  abstract = sharding_lib.restore_target(driver.abstract_state(), driver.state_shardings)
  state, meta = ckpt_lib.restore(manager, latest, abstract)
  # The schedule step and the data position (batches used; the step unless the method skips schedule
  # steps) are in the metadata; the state's own counters must agree with them.
  position = (start_step, int(meta.get("batches", start_step)))
  state_position = driver.position(state)
  if state_position != position:
    raise ValueError(
      f"checkpoint {manager.directory}/{latest} is inconsistent: its metadata says (step, batches) "
      f"{position}, its state {state_position}; nothing was changed. Use a fresh --workdir."
    )
  steps_changes = list(meta.get("steps_changes", []))
  if done:
    with open(summary_path) as f:
      return state, position, json.load(f), {}
  if saved_steps != config.trainer.steps:
    # Allowed: nothing depends on the length (or resume='force'); said, and recorded when it matters.
    if steps_dependence(config):
      steps_changes.append({"step": start_step, "from": saved_steps, "to": int(config.trainer.steps)})
      print(
        f"WARNING: --config.resume=force: resuming a run of {saved_steps} steps with --config.trainer.steps="
        f"{config.trainer.steps}; its schedule is rebuilt for {config.trainer.steps} steps from step {start_step} "
        "(recorded as steps_changes in the checkpoints and the summary)"
      )
    else:
      print(
        f"resuming a run of {saved_steps} steps with --config.trainer.steps={config.trainer.steps} "
        "(nothing of its training depends on the run's length)"
      )
  saved_evals = saved.get("trainer.eval_batches", config.trainer.eval_batches)
  if int(saved_evals) != int(config.trainer.eval_batches):
    print(
      f"note: --config.trainer.eval_batches={config.trainer.eval_batches}, where the run before step {start_step} "
      f"evaluated on {saved_evals}: its eval losses from here on average another held-out set (each eval "
      "record in metrics.jsonl carries its count, eval_batches)"
    )
  print(f"resumed from {workdir} at step {start_step}")
  changes = {"steps_changes": steps_changes, "code_changes": code_changes}
  return state, position, None, {k: v for k, v in changes.items() if v}


def check_code(
  config: ml_collections.ConfigDict, workdir: str, meta: Mapping[str, Any], code: dict[str, Any], trains: bool
) -> list[dict[str, Any]]:
  """The run's `code_changes` (those its checkpoint carries, and this resume's) after comparing
  `code`, this run's fingerprint (`fingerprint.fingerprint`), with the checkpoint's (`meta`).
  `trains`: the resume trains steps (False: a finished run asked again, of which nothing is trained,
  so nothing is recorded either, and the messages say so).

  A change of the run's own code (the callables given to `train()`, a method module of the user's)
  is refused, nothing changed, unless `config.resume` is 'force': a resume would train the rest of
  the run on other code, and a finished run would report the old code's summary. A change of
  hybridjax's own code is said and recorded, not refused. A checkpoint without a fingerprint
  (written before runs recorded one) resumes with a note. Each change is recorded as
  {"step", "changed", "from", "to"}: both fingerprints."""
  step = int(meta["step"])
  changes = list(meta.get("code_changes", []))
  saved = meta.get("code")
  if saved is None:
    print(
      f"note: the checkpoint at step {step} in {workdir} records no code fingerprint (it was written before runs "
      "recorded one): the code it was trained with cannot be compared with this run's"
    )
    return changes
  own, hybridjax_changed = fingerprint_lib.compare(saved, code)
  if own and config.resume != "force":
    raise ValueError(
      f"--workdir {workdir} holds a run trained with other code: {fingerprint_lib.describe_parts(own)} changed "
      f"since its checkpoint at step {step}. Resuming would train the rest of the run on other code than its first "
      f"{step} steps, and a finished run would report the old code's results. Use a new --workdir, or pass "
      "--config.resume=force to go on with this code (its checkpoints and summary then record both fingerprints, "
      "as code_changes)."
    )
  recorded = (
    "recorded as code_changes in the checkpoints and the summary"
    if trains
    else "the run has finished: nothing is trained, and nothing recorded"
  )
  if own:
    print(
      f"WARNING: --config.resume=force: resuming at step {step} with other code ({fingerprint_lib.describe_parts(own)} "
      f"changed); {recorded}"
    )
  if hybridjax_changed:
    print(
      f"note: hybridjax's own code changed since the checkpoint at step {step} (fingerprint {saved.get('hybridjax')} "
      f"-> {code['hybridjax']}); {recorded}"
    )
  if own or hybridjax_changed:
    changes.append({"step": step, "changed": own + ["hybridjax"] * hybridjax_changed, "from": saved, "to": code})
  return changes
