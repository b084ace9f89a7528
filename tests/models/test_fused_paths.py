"""The GPT-2's other attention path and its chunked loss compute what today's do.

`model.attention='xla'` (`jax.nn.dot_product_attention`, the path a CPU can run; cuDNN's needs an
NVIDIA GPU) against the einsum, and `model.loss_chunk` against the whole-logits loss: the loss and
logits to rtol 1e-5, every gradient to 1e-4 of its leaf's largest entry (atol) plus rtol 1e-4, in
float32, at the `tiny` preset's shape (plain and with the recipe's options around the attention) and
on a 2-layer model of GPT-2 Small's width (768, 12 heads) and vocabulary (50257) at T = 32 (the slow
set: their compiles take seconds), and at a micro shape in the default suite.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import gpt2_small
from hybridjax import preflight
from hybridjax.models import attention, gpt2, lm_loss

TINY = gpt2.PRESETS["tiny"]
MICRO = gpt2.GPT2Config(vocab_size=256, n_ctx=16, n_layer=2, n_head=2, d_model=32)
WIDE = dataclasses.replace(gpt2.PRESETS["124m"], n_layer=2, n_ctx=32)  # 124M's width and vocabulary
# The recipe's pieces that sit around the attention call, and the soft-capped untied head.
RECIPE = dict(
  rotary=True,
  qk_norm=True,
  rmsnorm=True,
  value_residual=True,
  value_embeds=1,
  learned_attn_scale="head",
  untied_head=True,
  logit_softcap=15.0,
)
RTOL, GRAD_TOL = 1e-5, 1e-4


def _loss_and_grads(cfg: gpt2.GPT2Config, params, tokens):
  batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, 1)}
  (loss, _), grads = jax.jit(jax.value_and_grad(gpt2.make_loss_fn(gpt2.GPT2(cfg)), has_aux=True))(params, batch)
  return loss, grads


def _params(cfg: gpt2.GPT2Config, tokens):
  """Initial params moved off their init (the zero-initialised head and scales get values)."""
  params = jax.jit(gpt2.GPT2(cfg).init)(jax.random.key(1), tokens)["params"]
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  return jax.tree.unflatten(tree, [p + 0.02 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])


def _assert_same(got, want):
  (loss, grads), (want_loss, want_grads) = got, want
  np.testing.assert_allclose(loss, want_loss, rtol=RTOL)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=GRAD_TOL, atol=GRAD_TOL * float(jnp.max(jnp.abs(w))))


# The default suite keeps the recipe's micro model (its paths hold the plain one's, and rotary, QK-norm,
# the value residual and embeddings around the call); the plain micro and `tiny` models are slow.
SHAPES = [
  pytest.param(MICRO, {}, id="micro-plain", marks=pytest.mark.slow),
  pytest.param(MICRO, RECIPE, id="micro-recipe"),
  pytest.param(TINY, {}, id="tiny-plain", marks=pytest.mark.slow),  # a few seconds of compiling each
  pytest.param(TINY, RECIPE, id="tiny-recipe", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("shape, options", SHAPES)
def test_xla_attention_equals_the_einsum(shape, options):
  cfg = dataclasses.replace(shape, **options)
  tokens = jax.random.randint(jax.random.key(0), (4, shape.n_ctx), 0, shape.vocab_size)
  params = _params(cfg, tokens)
  einsum = dataclasses.replace(cfg, attention="einsum")
  xla = dataclasses.replace(cfg, attention="xla")
  _assert_same(_loss_and_grads(xla, params, tokens), _loss_and_grads(einsum, params, tokens))


@pytest.mark.parametrize("shape, options", SHAPES)
def test_the_chunked_loss_equals_the_whole_logits_loss(shape, options):
  cfg = dataclasses.replace(shape, **options)
  tokens = jax.random.randint(jax.random.key(0), (4, shape.n_ctx), 0, shape.vocab_size)
  params = _params(cfg, tokens)
  chunk = 3 * shape.n_ctx // 8  # not a divisor: the last chunk is padded
  _assert_same(
    _loss_and_grads(dataclasses.replace(cfg, loss_chunk=chunk), params, tokens), _loss_and_grads(cfg, params, tokens)
  )


@pytest.mark.slow  # two 124M-vocabulary programs' compiles and gradients (~30 s)
def test_both_new_paths_equal_todays_at_124m_width_and_vocabulary():
  tokens = jax.random.randint(jax.random.key(0), (2, WIDE.n_ctx), 0, WIDE.vocab_size)
  params = _params(WIDE, tokens)
  new = dataclasses.replace(WIDE, attention="xla", loss_chunk=8)
  _assert_same(_loss_and_grads(new, params, tokens), _loss_and_grads(WIDE, params, tokens))


def test_the_chunked_loss_never_holds_the_whole_logits():
  """The compiled loss's largest temporary is a chunk's logits, not the whole (B, T, vocab)."""
  hidden = jax.ShapeDtypeStruct((2, 64, 16), jnp.float32)
  head = jax.ShapeDtypeStruct((1000, 16), jnp.float32)
  targets = jax.ShapeDtypeStruct((2, 64), jnp.int32)
  whole_logits = 2 * 64 * 1000 * 4

  def temp(chunk: int) -> int:
    loss = lambda h, w, y: lm_loss.chunked_cross_entropy(h, w, y, chunk)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, head, targets).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  assert temp(8) < whole_logits / 2 < temp(64)


def test_the_loss_soft_cap_matches_the_models():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  head = jax.random.normal(jax.random.key(1), (11, 8)) * 3
  y = jax.random.randint(jax.random.key(2), (2, 5), 0, 11)
  logits = 2.0 * jnp.tanh((x @ head.T) / 2.0)
  want = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1))
  np.testing.assert_allclose(lm_loss.chunked_cross_entropy(x, head, y, 2, softcap=2.0), want, rtol=1e-6)
  with pytest.raises(ValueError, match="chunk"):
    lm_loss.chunked_cross_entropy(x, head, y, 0)


def test_features_are_what_the_logits_are_computed_from():
  cfg = dataclasses.replace(MICRO, untied_head=True)
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, MICRO.vocab_size)
  params = _params(cfg, tokens)
  apply = jax.jit(gpt2.GPT2(cfg).apply, static_argnames="features")
  hidden, head = apply({"params": params}, tokens, features=True)
  chex.assert_shape((hidden, head), ((2, 16, cfg.d_model), (cfg.vocab_size, cfg.d_model)))
  logits = apply({"params": params}, tokens)
  np.testing.assert_array_equal(logits, jnp.einsum("btd,vd->btv", hidden, head, precision="highest"))


@pytest.mark.parametrize(
  "changes, backend, want",
  [
    ({}, "cpu", "einsum"),  # the CPU keeps today's numerics
    ({"dtype": "bfloat16"}, "cuda", "cudnn"),
    ({"dtype": "float16"}, "gpu", "cudnn"),
    ({}, "cuda", "xla"),  # float32: cuDNN's kernel takes no float32
    ({"dtype": "bfloat16", "n_head": 1}, "cuda", "cudnn"),  # head_dim 128: the largest cuDNN takes here
    ({"dtype": "bfloat16", "d_model": 256, "n_head": 1}, "cuda", "xla"),  # head_dim 256 > 128
    ({"dtype": "bfloat16"}, "rocm", "xla"),
    ({"dtype": "bfloat16"}, "tpu", "xla"),
    ({"dtype": "bfloat16", "dropout": 0.1}, "cuda", "einsum"),  # attention dropout: the einsum only
    ({"attention": "xla"}, "cpu", "xla"),
    ({"attention": "einsum", "dtype": "bfloat16"}, "cuda", "einsum"),
  ],
)
def test_auto_picks_the_path_per_backend(changes, backend, want):
  cfg = dataclasses.replace(TINY, **changes)
  assert attention.attention_implementation(cfg, backend) == want


def test_an_impossible_attention_path_is_refused_naming_the_field():
  with pytest.raises(ValueError, match=r"model.attention='cudnn' runs on an NVIDIA GPU only.*--config.model.attention"):
    attention.attention_implementation(dataclasses.replace(TINY, attention="cudnn", dtype="bfloat16"), "cpu")
  for changes, match in [
    ({"attention": "flash"}, r"model.attention must be one of"),
    ({"attention": "xla", "dropout": 0.1}, r"model.attention='xla' has no attention dropout"),
    ({"attention": "cudnn"}, r"model.attention='cudnn' needs model.dtype"),
    ({"loss_chunk": -1}, r"model.loss_chunk must be >= 0, got -1"),
  ]:
    with pytest.raises(ValueError, match=match):
      dataclasses.replace(TINY, **changes).validate()
  c = gpt2_small.get_config("tiny,micro")
  c.model.update(attention="xla", dropout=0.1)
  with pytest.raises(ValueError, match=r"--config.model.attention='xla' has no attention dropout"):
    preflight.validate(c)
  c.model.update(attention="auto", loss_chunk=-1)
  with pytest.raises(ValueError, match=r"--config.model.loss_chunk"):
    preflight.validate(c)


def test_rotary_on_the_fused_layout_equals_the_einsum_layout():
  x = jax.random.normal(jax.random.key(0), (2, 3, 10, 8))  # (batch, heads, time, head_dim)
  got = gpt2.rotate(x.transpose(0, 2, 1, 3), 10000.0, time_axis=1).transpose(0, 2, 1, 3)
  np.testing.assert_array_equal(got, gpt2.rotate(x, 10000.0))
