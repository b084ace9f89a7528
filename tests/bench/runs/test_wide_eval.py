"""An anchor that ends with a wide eval (`specs.run_spec(wide_eval=...)`, `runs.wide_eval_run`): only a spec
that asks for it holds the field and runs that module; every other anchor keeps its spec, code and key."""

from __future__ import annotations

import math

import pytest

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import codehash
from hybridjax.bench import specs
from hybridjax.bench.runs import anchor_run, keys, worker


def _spec(wide_eval=0, steps=6):
  c = benchmark_cfg.get_config("quick")
  return specs.run_spec(c, kind="anchor", seed=1, lr=0.01, steps=steps, beta=0.99, betas=[0.99], wide_eval=wide_eval)


def test_only_a_spec_that_asks_for_a_wide_eval_holds_it_and_runs_its_module():
  plain, wide = _spec(), _spec(wide_eval=8)
  assert "wide_eval" not in plain and wide["wide_eval"] == 8
  assert {k: v for k, v in wide.items() if k != "wide_eval"} == plain
  assert keys.spec_modules(plain) == [keys.RUNNER_MODULES["anchor"], keys.spec_modules(plain)[1]]
  assert keys.spec_modules(wide) == keys.spec_modules(plain) + [keys.WIDE_EVAL_MODULE]
  # The anchors' code is not the wide eval's: its module is outside their closure.
  assert not any(p.endswith("wide_eval_run.py") for p in codehash.source_closure(keys.RUNNER_MODULES["anchor"]))
  assert keys.run_key(wide) != keys.run_key(plain)
  with pytest.raises(ValueError, match="a wide eval ends an anchor run"):
    specs.run_spec(benchmark_cfg.get_config("quick"), kind="method", seed=1, lr=0.01, steps=6, beta=0.99, wide_eval=2)


@pytest.mark.slow  # two short quick-preset runs, compiled (seconds)
def test_a_wide_eval_leaves_the_anchors_result_bit_for_bit_and_scores_more_windows():
  plain = anchor_run.run_anchor(_spec())
  wide = worker.execute(_spec(wide_eval=3), workdir="")
  timings = ("compile_s", "train_s")
  assert {k: v for k, v in wide.items() if k not in timings + ("wide_eval",)} == {
    k: v for k, v in plain.items() if k not in timings
  }
  c = benchmark_cfg.get_config("quick")
  w = wide["wide_eval"]
  assert w["factor"] == 3 and w["windows"] == 3 * int(c.trainer.eval_batches) * int(c.trainer.batch_size)
  assert len(w["final_averaged_per_batch"]) == 3 * int(c.trainer.eval_batches)
  assert math.isfinite(w["final_raw"]) and w["final_averaged"]["0.99"] == pytest.approx(
    sum(w["final_averaged_per_batch"]) / len(w["final_averaged_per_batch"]), rel=1e-6
  )
