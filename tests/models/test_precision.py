"""The precision policy (docs/performance.md, "Precision"): what stays float32 when the model computes
in bfloat16, and a bfloat16 run's loss against a float32 one's."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from conftest import cached, run_experiment

from hybridjax.models import gpt2

# A bfloat16 `tiny` run's losses against a float32 one's after 200 steps, relative.
BF16_TOLERANCE = 0.02


def test_bfloat16_compute_keeps_params_grads_scores_logits_and_loss_in_float32():
  cfg = dataclasses.replace(gpt2.GPT2Config(vocab_size=64, n_ctx=8, n_layer=1, n_head=2, d_model=16), dtype="bfloat16")
  model = gpt2.GPT2(cfg)
  tokens = jnp.zeros((2, 8), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]  # shapes and dtypes: nothing run
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  batch = {"inputs": tokens, "targets": tokens}
  (loss, _), grads = jax.eval_shape(jax.value_and_grad(gpt2.make_loss_fn(model), has_aux=True), params, batch)
  assert loss.dtype == jnp.float32 and {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
  assert jax.eval_shape(model.apply, {"params": params}, tokens).dtype == jnp.float32  # the logits
  hidden, _ = jax.eval_shape(lambda p: model.apply({"params": p}, tokens, features=True), params)
  assert hidden.dtype == jnp.bfloat16  # the compute
  # The attention scores: the einsum's product is requested in float32.
  jaxpr = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens))(params))
  assert "preferred_element_type=float32" in jaxpr


@pytest.mark.slow  # two 200-step `tiny` runs (1 to 4 min on 2 cores, with the machine's load)
def test_a_bfloat16_tiny_run_trains_as_a_float32_one(tmp_path, jax_cache):
  from experiments.configs import gpt2_small

  summaries = {}
  for dtype in ("float32", "bfloat16"):
    c = cached(gpt2_small.get_config("tiny"), jax_cache)
    c.model.dtype = dtype
    c.trainer.update(steps=200, log_every=50, eval_every=0, checkpoint_every=0, progress=False)
    summaries[dtype] = run_experiment(c, tmp_path / dtype)
  f32, bf16 = summaries["float32"]["final_eval_loss"], summaries["bfloat16"]["final_eval_loss"]
  assert summaries["float32"]["first_train_loss"] > f32 + 1.0  # both trained
  assert abs(bf16 - f32) <= BF16_TOLERANCE * f32, (f32, bf16)
