"""An anchor run that ends with a wide eval: `anchor_run.run_anchor`'s run, its result unchanged, and its
final raw and averaged params scored again on `spec['wide_eval']` times the config's eval windows
(`trainer.eval_batches` times that many batches, drawn as the task draws its own). A spec without the field
runs through `anchor_run` alone; this module is apart so that those runs keep their code and their keys
(`keys.spec_modules` adds it only to a spec that asks for it). The run is `anchor_run.train_anchor`'s, which
hands back the final state (a test checks that the results agree bit for bit)."""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from hybridjax.bench import tasks as tasks_lib
from hybridjax.bench.runs import anchor_run
from hybridjax.loop import baseline
from hybridjax.loop.evaluation import eval_losses


def run_anchor_with_wide_eval(spec: dict[str, Any]) -> dict[str, Any]:
  """`anchor_run.run_anchor(spec)`'s result, and `wide_eval`: the eval windows' count, the raw params' and
  the averaged params' (at the spec's beta) mean loss on them, and each batch's loss of the averaged ones."""
  factor = int(spec["wide_eval"])
  result, final, eval_fn, c = anchor_run.train_anchor(spec)
  wide = ml_collections.ConfigDict(c.to_dict())
  wide.trainer.eval_batches = factor * int(c.trainer.eval_batches)
  batches = tasks_lib.build(spec["task"], wide)["eval_batches"]
  averaged = eval_losses(eval_fn, final.averaging.params, batches)
  result["wide_eval"] = {
    "factor": factor,
    "windows": len(batches) * int(c.trainer.batch_size),
    "final_raw": baseline.finite_or_inf(float(np.mean(eval_losses(eval_fn, final.params, batches)))),
    "final_averaged": {str(float(c.trainer.averaging_beta)): baseline.finite_or_inf(float(np.mean(averaged)))},
    "final_averaged_per_batch": [float(x) for x in averaged],
  }
  return result
