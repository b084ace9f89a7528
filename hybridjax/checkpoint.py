"""Checkpoints: the whole training state plus the data position and the config, with orbax.

A checkpoint holds two items: `state` (any pytree: a `TrainState` or a `HybridState`) and `meta`
(JSON: the step, i.e. the data position, since batches are deterministic in (seed, step), and the
config). Saves are asynchronous; orbax writes to a temporary directory and renames it when complete,
so a save interrupted by a crash is never mistaken for a checkpoint.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

# Fields that may change between a run and its resumption without changing what is trained.
RUNTIME_FIELDS = frozenset({
    "resume", "trainer.steps", "trainer.log_every", "trainer.eval_every", "trainer.eval_batches",
    "trainer.checkpoint_every", "trainer.max_to_keep", "trainer.progress", "trainer.compile_cache",
    "trainer.compile_cache_dir", "trainer.memory_limit_bytes", "data.cache_dir",
})


def make_manager(directory: str, *, max_to_keep: int = 3,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory`; the trainer decides when to save."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(
      os.path.abspath(directory), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict[str, Any]) -> None:
  """Starts an (asynchronous) save of `state` and `meta` at `step`."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)


def flatten_config(config: ml_collections.ConfigDict | dict, prefix: str = "") -> dict[str, Any]:
  """{'trainer.steps': 600, ...} from a nested config."""
  d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  flat = {}
  for k, v in d.items():
    name = f"{prefix}{k}"
    if isinstance(v, dict):
      flat.update(flatten_config(v, name + "."))
    else:
      flat[name] = v
  return flat


def config_differences(saved: dict[str, Any], current: ml_collections.ConfigDict) -> list[str]:
  """Fields (outside RUNTIME_FIELDS) whose values differ, as readable lines."""
  a = flatten_config(saved)
  b = flatten_config(json.loads(current.to_json()))
  diffs = []
  for k in sorted(set(a) | set(b)):
    if k in RUNTIME_FIELDS:
      continue
    if a.get(k, "<absent>") != b.get(k, "<absent>"):
      diffs.append(f"{k}: checkpoint has {a.get(k, '<absent>')!r}, config has {b.get(k, '<absent>')!r}")
  return diffs


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  """Reads only the JSON metadata of the checkpoint at `step`."""
  restored = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
  return restored["meta"]


def _key_name(k: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _tree_lines(tree: Any) -> dict[str, tuple]:
  """{'train.params.h_0.attn.c_attn.kernel': (shape, dtype)}; the same names for a live tree and
  for orbax's stored metadata (which keeps dicts where the live tree has dataclasses)."""
  if hasattr(tree, "tree"):
    tree = tree.tree
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {".".join(_key_name(k) for k in p): (tuple(getattr(x, "shape", ())),
                                              str(getattr(x, "dtype", ""))) for p, x in leaves}


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: Any) -> tuple[Any, dict]:
  """Restores (state, meta) at `step` onto the structure of `abstract_state`.

  Raises a ValueError that lists the mismatched leaves (expected against found) when the
  checkpoint holds another model or state layout, instead of an error from deep inside orbax.
  """
  try:
    found = manager.item_metadata(step)
    found_state = found["state"] if found is not None and "state" in found else None
  except Exception:  # metadata unreadable: the restore below reports the problem
    found_state = None
  if found_state is not None:
    expected = _tree_lines(abstract_state)
    got = _tree_lines(found_state)
    problems = []
    for k in sorted(set(expected) | set(got)):
      if k not in got:
        problems.append(f"missing in checkpoint: {k} expected shape {expected[k][0]}")
      elif k not in expected:
        problems.append(f"unexpected in checkpoint: {k} shape {got[k][0]}")
      elif expected[k][0] != got[k][0]:
        problems.append(f"{k}: expected shape {expected[k][0]}, found {got[k][0]}")
    if problems:
      shown = "\n  ".join(problems[:20])
      more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
      raise ValueError(
          f"checkpoint {manager.directory}/{step} does not match this model/config:\n  {shown}{more}\n"
          "Use a fresh --workdir for a different model, or the config the checkpoint was made with.")
  try:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
  except Exception as e:
    raise ValueError(
        f"could not restore checkpoint {manager.directory}/{step}: {type(e).__name__}: {e}\n"
        "The checkpoint may be truncated or from another model; nothing was deleted.") from e
  return restored["state"], restored["meta"]
