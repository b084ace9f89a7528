"""An anchor run: the baseline loop (`loop.baseline`) on the spec's task, with the params' average at
the spec's beta in the train state and, on tuning seeds, at the other betas beside it. It imports no
part of the hybrid algorithm, so editing a method keeps every cached anchor (`keys.run_key`)."""

from __future__ import annotations

import json
from typing import Any

import jax
import ml_collections
import numpy as np

from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.loop import baseline

_PROGRAMS: dict[str, Any] = {}  # this process's compiled anchor programs, by task/model/optimizer config


def _programs(spec: dict[str, Any], c: ml_collections.ConfigDict, task: dict[str, Any]) -> tuple[Any, Any, Any]:
  """(tx, step, eval_fn): one compiled step per family, since the LR and the schedule's length are
  runtime values."""
  flat = config_lib.flatten(c)
  key = json.dumps(
    {k: v for k, v in flat.items() if not k.startswith(("trainer.", "seed", "optim.learning_rate"))}
    | {"grad_accum": flat["trainer.grad_accum"], "batch_size": flat["trainer.batch_size"], "task": spec["task"]},
    sort_keys=True,
    default=str,
  )
  if key not in _PROGRAMS:
    params_shape = jax.eval_shape(task["init_params"], jax.random.PRNGKey(0))
    tx = optim_lib.resolve_optimizer(c.optim, params_shape, task.get("tx"))
    step = baseline.make_train_step(task["loss_fn"], tx, c.trainer.grad_accum)
    _PROGRAMS[key] = (tx, step, baseline.make_eval_fn(task["loss_fn"]))
  return _PROGRAMS[key]


def run_anchor(spec: dict[str, Any]) -> dict[str, Any]:
  """A baseline run with its averaged params (and, on tuning seeds, the averages at other betas).

  The train state carries the average at `trainer.averaging_beta`, exactly as `train()` does; the
  other betas' averages are side buffers of the loop, updated after each step.
  """
  return train_anchor(spec)[0]


def train_anchor(spec: dict[str, Any]) -> tuple[dict[str, Any], Any, Any, ml_collections.ConfigDict]:
  """(`run_anchor`'s result, the final train state, the eval function, the run's config): for a run
  that scores the final state again (`wide_eval_run`)."""
  c = ml_collections.ConfigDict(spec["config"])
  task = tasks_lib.build(spec["task"], c)
  tx, step, eval_fn = _programs(spec, c, task)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))  # as `loop.train.make_driver`
  state = optim_lib.init_train_state(task["init_params"](params_rng), tx, c.trainer.averaging_beta)
  beta = float(c.trainer.averaging_beta)
  out = baseline.run(
    state,
    step,
    train_batch=task["train_batch"],
    eval_batches=task["eval_batches"],
    eval_fn=eval_fn,
    schedule=optim_lib.make_schedule(c.optim, c.trainer.steps),
    steps=int(c.trainer.steps),
    eval_every=int(c.trainer.eval_every),
    side_betas=[b for b in spec["betas"] if b != beta],
  )
  per_batch = out["final_averaged_per_batch"]
  final_averaged = {str(beta): out["curve"][-1]["eval_loss_averaged"]} | {
    str(b): v for b, v in out["side_averaged"].items()
  }
  result = {
    "kind": "anchor",
    "seed": int(c.seed),
    "lr": float(c.optim.learning_rate),
    "steps": int(c.trainer.steps),
    "beta": beta,
    "final_raw": out["final_raw"],
    "final_averaged": final_averaged,
    "eval_batch_std": float(np.std(per_batch, ddof=1)) if len(per_batch) > 1 else 0.0,
    "final_averaged_per_batch": per_batch,  # for the eval set's paired sampling error
    "eval_batches": len(task["eval_batches"]),
    "nonfinite_skipped": int(out["state"].nonfinite_total),
    "curve": out["curve"],
    "compile_s": out["compile_s"],
    "train_s": out["train_s"],
  }
  return result, out["state"], eval_fn, c
