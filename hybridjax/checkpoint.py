"""Checkpoints: the whole training state plus the data position and the config, with orbax.

A checkpoint holds two items: `state` (any pytree: a `TrainState` or a `HybridState`) and `meta`
(JSON: the step, i.e. the data position, since batches are deterministic in (seed, step), and the
config). Saves are asynchronous; orbax writes to a temporary directory and renames it when complete,
so a save interrupted by a crash is never mistaken for a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from hybridjax import config as config_lib
from hybridjax import identity

# Fields that may change between a run and its resumption without changing what is trained: those
# declared runtime (`schema.Field.runtime`; where the state lives is one: a checkpoint restores onto
# any mesh shape and any number of hosts).
RUNTIME = identity.runtime_fields()


def make_manager(directory: str, *, max_to_keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory`; the trainer decides when to save."""
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(
    os.path.abspath(directory),
    options=options,
    item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
  )


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict[str, Any]) -> None:
  """Starts an (asynchronous) save of `state` and `meta` at `step`."""
  manager.save(
    step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True
  )


def config_differences(saved: dict[str, Any], current: ml_collections.ConfigDict) -> list[str]:
  """Fields (outside RUNTIME) whose values differ between two configs as a run reads them
  (`identity.comparable`), as readable lines. A field missing from one side (a checkpoint written
  before the field existed) compares as its default (`identity.field_defaults`)."""
  defaults = identity.field_defaults()
  a, b = identity.comparable(saved), identity.comparable(current)
  diffs = []
  for k in sorted(set(a) | set(b)):
    if k in RUNTIME:
      continue
    old, new = a.get(k, defaults.get(k, "<absent>")), b.get(k, defaults.get(k, "<absent>"))
    if old != new:
      diffs.append(f"{k}: checkpoint has {old!r}, config has {new!r}")
  return diffs


def _short_error(e: BaseException) -> str:
  """`Type: first line` of an orbax/TensorStore error, naming the state leaf it was reading if the
  message says (their full text is a page-long TensorStore spec)."""
  text = str(e)
  m = re.search(r'"([^"/\s]+)/\.zarray"', text) or re.search(r"'path': '([^/'][^']*?)/'", text)
  first = (text.strip().splitlines() or [""])[0]
  for cut in (" See full TensorStore details", " [tensorstore_spec="):
    first = first.split(cut)[0]
  if len(first) > 300:
    first = first[:300] + " ..."
  leaf = f" (while reading leaf {m.group(1)})" if m else ""
  return f"{type(e).__name__}: {first}{leaf}"


def _is_abandoned_read(unraisable: Any) -> bool:
  """Whether an unraisable exception is a read that orbax abandoned calling back into its closed loop.

  orbax restores a checkpoint's leaves in one event loop (`asyncio_utils.run_sync`) and closes the
  loop as soon as the first read fails, while TensorStore still holds the other reads; as each one
  completes, its callback calls `call_soon_threadsafe` on the closed loop, and Python prints the
  RuntimeError as a stray traceback after the restore's own error. It carries nothing: the error
  that matters is the restore's."""
  e = unraisable.exc_value
  if unraisable.object is not None or not isinstance(e, RuntimeError) or str(e) != "Event loop is closed":
    return False
  return any(f.name == "call_soon_threadsafe" for f in traceback.extract_tb(unraisable.exc_traceback))


@contextlib.contextmanager
def _abandoned_reads_silenced() -> Iterator[None]:
  """Runs an orbax read with the callbacks of the reads it abandons (`_is_abandoned_read`) dropped:
  they arrive from TensorStore's threads while the failed read's error is still on its way out of
  orbax, or later. When the read fails, the filter stays in place for the rest of the process; every
  other unraisable exception still goes to the hook that was in place."""
  previous = sys.unraisablehook
  installed = not getattr(previous, "drops_abandoned_reads", False)
  if installed:

    def hook(unraisable: Any) -> None:
      if not _is_abandoned_read(unraisable):
        previous(unraisable)

    hook.drops_abandoned_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
  yield  # an error propagates with the filter kept
  if installed and sys.unraisablehook is hook:  # a read that succeeded abandoned nothing
    sys.unraisablehook = previous


def _corrupt_hint(manager: ocp.CheckpointManager, step: int) -> str:
  others = [s for s in manager.all_steps() if s != step]
  where = f"{manager.directory}/{step}"
  if others:
    return (
      f"It is truncated or corrupted; nothing was deleted or changed. To resume from the "
      f"previous checkpoint (steps {others}), move {where} out of the checkpoints folder; "
      "or start a fresh --workdir."
    )
  return (
    "It is truncated or corrupted; nothing was deleted or changed. Start a fresh --workdir "
    f"(or move {where} aside to start this one from scratch)."
  )


def _read(manager: ocp.CheckpointManager, step: int, failed: str, **items: Any) -> Any:
  """The checkpoint's `items` at `step` (`ocp.args.Composite` of them), read with the reads orbax
  abandons silenced; a ValueError saying `failed`, the error and what to do when the read fails."""
  try:
    with _abandoned_reads_silenced():
      return manager.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:
    raise ValueError(f"{failed}: {_short_error(e)}\n{_corrupt_hint(manager, step)}") from e


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  """Reads only the JSON metadata (the step, i.e. the data position, and the config) at `step`.

  Raises a ValueError naming the checkpoint when the metadata is missing or unreadable.
  """
  failed = f"could not read the metadata (step, config) of checkpoint {manager.directory}/{step}"
  meta = _read(manager, step, failed, meta=ocp.args.JsonRestore())["meta"]
  if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
    found = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
    raise ValueError(
      f"checkpoint {manager.directory}/{step} has metadata without an integer "
      f"'step' (found {found}): it was not written by hybridjax.\n"
      f"{_corrupt_hint(manager, step)}"
    )
  return meta


def _key_name(k: Any) -> str:
  return next((str(getattr(k, a)) for a in ("key", "name", "idx") if hasattr(k, a)), str(k))


def _path_name(path: tuple) -> str:
  return ".".join(_key_name(k) for k in path)


def _tree_lines(tree: Any) -> dict[str, tuple]:
  """{'train.params.h_0.attn.c_attn.kernel': (shape, dtype)}; the same names for a live tree and
  for orbax's stored metadata (which keeps dicts where the live tree has dataclasses)."""
  if hasattr(tree, "tree"):
    tree = tree.tree
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {_path_name(p): (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", ""))) for p, x in leaves}


# Leaves of the state added after checkpoints were first written, with the value they take when a
# checkpoint written before them resumes: counters of events that run could not have had.
ADDED_LEAVES = {
  "controller.nonfinite_predicted": 0,  # predicted steps discarded as non-finite (they were kept before)
  "controller.discarded": 0,
}


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: Any) -> tuple[Any, dict]:
  """Restores (state, meta) at `step` onto the structure of `abstract_state`. A checkpoint written
  before a leaf of `ADDED_LEAVES` existed resumes with that leaf at its value there.

  Raises a ValueError that lists the mismatched leaves (expected against found) when the
  checkpoint holds another model or state layout, instead of an error from deep inside orbax.
  """
  try:
    with _abandoned_reads_silenced():
      found = manager.item_metadata(step)
  except Exception:  # metadata unreadable: the restore below reports the problem
    found = None
  found_state = found["state"] if found is not None and "state" in found else None
  if found is not None and found_state is None:
    items = sorted(k for k in found.keys() if found[k] is not None)
    raise ValueError(
      f"checkpoint {manager.directory}/{step} has no readable 'state' item (it, or "
      f"its _METADATA, is missing; readable items: {items}).\n"
      f"{_corrupt_hint(manager, step)}"
    )
  added = []
  if found_state is not None:
    expected = _tree_lines(abstract_state)
    got = _tree_lines(found_state)
    problems = []
    for k in sorted(set(expected) & set(got)):
      (shape, dtype), (found_shape, found_dtype) = expected[k], got[k]
      if shape != found_shape:
        problems.append(f"{k}: expected shape {shape}, found {found_shape}")
      elif dtype and found_dtype and dtype != found_dtype:
        problems.append(f"{k}: expected dtype {dtype}, found {found_dtype}")
    added = sorted(set(expected) - set(got) & set(ADDED_LEAVES))
    missing = sorted(set(expected) - set(got) - set(added))
    unexpected = sorted(set(got) - set(expected))
    # Another state layout misses or adds whole subtrees: list a few leaves, summarise the rest.
    for what, keys, shapes in (
      ("missing in checkpoint", missing, expected),
      ("unexpected in checkpoint", unexpected, got),
    ):
      if len(keys) <= 6:
        problems += [f"{what}: {k} shape {shapes[k][0]}" for k in keys]
      else:
        tops = sorted({k.split(".")[0] for k in keys})
        problems.append(f"{what}: {len(keys)} leaves under {', '.join(tops)}, e.g. {keys[0]}")
    if problems:
      shown = "\n  ".join(problems[:20])
      more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
      raise ValueError(
        f"checkpoint {manager.directory}/{step} does not match this model/config:\n  {shown}{more}\n"
        "Use a fresh --workdir for a different model, or the config the checkpoint was made with."
      )
  # A checkpoint that lacks leaves of `ADDED_LEAVES` is read as it was saved (`_with_added` adds them).
  restored = _read(
    manager,
    step,
    f"could not restore checkpoint {manager.directory}/{step}",
    state=ocp.args.StandardRestore(None if added else abstract_state),
    meta=ocp.args.JsonRestore(),
  )
  state = _with_added(restored["state"], abstract_state, added) if added else restored["state"]
  return state, restored["meta"]


def _with_added(tree: Any, abstract_state: Any, added: list[str]) -> Any:
  """The state `tree`, read without a target from a checkpoint that lacks the leaves `added` (of
  `ADDED_LEAVES`): those leaves at their `ADDED_LEAVES` values, laid out as `abstract_state`."""
  import numpy as np

  def saved(path: tuple) -> Any:
    node = tree
    for part in (_key_name(k) for k in path):
      node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    return node

  def value(path: tuple, like: Any) -> Any:
    name = _path_name(path)
    x = np.full(like.shape, ADDED_LEAVES[name], like.dtype) if name in added else saved(path)
    sharding = getattr(like, "sharding", None)
    return jax.device_put(x, sharding) if sharding is not None else jax.numpy.asarray(x)

  return jax.tree_util.tree_map_with_path(value, abstract_state)


def _params_of(state: Any, averaged: bool) -> tuple[Any, bool]:
  """(params, whether they are the averaged ones) of a restored state tree (a `TrainState`, or a
  `HybridState` whose `train` is one), read as the nested dicts orbax restores without a target."""
  train = state["train"] if isinstance(state, dict) and "train" in state else state
  if not isinstance(train, dict) or "params" not in train:
    found = sorted(train) if isinstance(train, dict) else type(train).__name__
    raise ValueError(f"the checkpoint's state holds no params (found {found}): it was not written by hybridjax")
  averaging = train.get("averaging")
  if averaged and isinstance(averaging, dict) and "params" in averaging:
    return averaging["params"], True
  return train["params"], False


def export_params(workdir: str | os.PathLike[str], *, step: int | None = None, averaged: bool = True) -> Any:
  """The params alone of a run's checkpoint, read without building its model or optimizer.

  Args:
    workdir: the run's `--workdir` (its checkpoints are under `<workdir>/checkpoints`).
    step: the checkpoint's step; None reads the latest. When the latest is not the run's end (it
      stopped before its `trainer.steps`: interrupted, diverged, or an emergency checkpoint), a
      warning names the step it reached; passing that step explicitly says you want those params.
    averaged: return the averaged params when the run averaged its weights
      (`trainer.averaging='ema'`: the run's model, the one its `final_eval_loss` measures). A run
      that did not average gives its raw params, with a warning that says so.

  Returns:
    The params pytree (nested dicts of arrays), as the model's `apply` takes them.

  Raises:
    FileNotFoundError: when `workdir` holds no checkpoint (or not the one at `step`); nothing is
      written or changed.
  """
  directory = os.path.join(os.fspath(workdir), "checkpoints")
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{workdir} holds no checkpoints (no {directory}): pass the --workdir of a run")
  manager = make_manager(directory, async_save=False)
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      raise FileNotFoundError(f"{directory} holds no finished checkpoint: pass the --workdir of a run that saved one")
    latest = step is None
    if latest:
      step = steps[-1]
    elif step not in steps:
      raise FileNotFoundError(f"{directory} has no checkpoint at step {step}; its steps are {steps}")
    failed = f"could not read checkpoint {directory}/{step}"
    state = _read(manager, step, failed, state=ocp.args.StandardRestore())["state"]
    try:  # the run's length, for the warning below; a checkpoint without readable metadata has none
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception:  # noqa: BLE001
      meta = None
  finally:
    manager.close()
  params, is_averaged = _params_of(state, averaged)
  total = config_lib.flatten(meta.get("config", {})).get("trainer.steps") if isinstance(meta, dict) else None
  if latest and isinstance(total, int) and step < total:
    warnings.warn(
      f"{workdir} stopped at step {step} of its {total} (--config.trainer.steps): the run did not finish "
      "(interrupted, diverged, or an emergency checkpoint), so these are its params at step "
      f"{step}, not its final ones. Resume the run (the same command) to finish it, or pass step={step} "
      "to export these params without this warning",
      stacklevel=2,
    )
  if averaged and not is_averaged:
    warnings.warn(
      f"{workdir} (step {step}) did not average its weights (trainer.averaging='none'): returning its raw params",
      stacklevel=2,
    )
  return params
