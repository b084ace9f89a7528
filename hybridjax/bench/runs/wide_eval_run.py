"""An anchor run that ends with a wide eval: `anchor_run.run_anchor`'s run, its result unchanged, and its
final raw and averaged params scored again on `spec['wide_eval']` times the config's eval windows
(`trainer.eval_batches` times that many batches, drawn as the task draws its own). A spec without the field
runs through `anchor_run` alone; this module is apart so that those runs keep their code and their keys
(`keys.spec_modules` adds it only to a spec that asks for it).

It repeats `run_anchor`'s run and result to keep the final state (a test checks that the results agree bit for
bit)."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from hybridjax import optim as optim_lib
from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.runs import anchor_run
from hybridjax.loop import baseline
from hybridjax.loop.evaluation import eval_losses


def run_anchor_with_wide_eval(spec: dict[str, Any]) -> dict[str, Any]:
  """`anchor_run.run_anchor(spec)`'s result, and `wide_eval`: the eval windows' count, the raw params' and
  the averaged params' (at the spec's beta) mean loss on them, and each batch's loss of the averaged ones."""
  factor = int(spec["wide_eval"])
  c = ml_collections.ConfigDict(spec["config"])
  task = tasks_lib.build(spec["task"], c)
  tx, step, eval_fn = anchor_run._programs(spec, c, task)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))  # as `run_anchor`
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
  per_batch = out["final_averaged_per_batch"]  # run_anchor's result, field by field
  final_averaged = {str(beta): out["curve"][-1]["eval_loss_averaged"]}
  final_averaged.update({str(b): v for b, v in out["side_averaged"].items()})
  result = {
    "kind": "anchor",
    "seed": int(c.seed),
    "lr": float(c.optim.learning_rate),
    "steps": int(c.trainer.steps),
    "beta": beta,
    "final_raw": out["final_raw"],
    "final_averaged": final_averaged,
    "eval_batch_std": float(np.std(per_batch, ddof=1)) if len(per_batch) > 1 else 0.0,
    "final_averaged_per_batch": per_batch,
    "eval_batches": len(task["eval_batches"]),
    "nonfinite_skipped": int(out["state"].nonfinite_total),
    "curve": out["curve"],
    "compile_s": out["compile_s"],
    "train_s": out["train_s"],
  }
  wide = ml_collections.ConfigDict(c.to_dict())
  wide.trainer.eval_batches = factor * int(c.trainer.eval_batches)
  batches = tasks_lib.build(spec["task"], wide)["eval_batches"]
  final = out["state"]
  averaged = eval_losses(eval_fn, final.averaging.params, batches)
  result["wide_eval"] = {
    "factor": factor,
    "windows": len(batches) * int(c.trainer.batch_size),
    "final_raw": baseline.finite_or_inf(float(np.mean(eval_losses(eval_fn, final.params, batches)))),
    "final_averaged": {str(beta): baseline.finite_or_inf(float(np.mean(averaged)))},
    "final_averaged_per_batch": [float(x) for x in averaged],
  }
  return result
