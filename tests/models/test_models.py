"""Tests for hybridjax.models (GPT-2 and the test MLP)."""

from __future__ import annotations

import dataclasses
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from hybridjax.models import gpt2, hf, mlp

TINY = gpt2.PRESETS["tiny"]
# Small enough for the NumPy reference and converter tests to be instant.
MICRO = gpt2.GPT2Config(vocab_size=64, n_ctx=16, n_layer=2, n_head=4, d_model=32)


@pytest.fixture(scope="module")
def tiny_params():
  init = jax.jit(gpt2.GPT2(TINY).init)
  return init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]


@functools.cache
def _init_micro(seed: int = 0):
  model = gpt2.GPT2(MICRO)
  init = jax.jit(model.init)
  return init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))["params"]


# -----------------------------------------------------------------------------
# Independent NumPy reference of HF GPT2LMHeadModel, working from HF names.
# -----------------------------------------------------------------------------


def _np_layer_norm(x, w, b, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * w + b


def _np_gelu_new(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def np_gpt2_logits(sd: dict[str, np.ndarray], tokens: np.ndarray, n_head: int):
  """HF GPT-2 forward pass in float64 NumPy; ``sd`` uses HF names."""
  sd = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in sd.items()}
  _, t = tokens.shape
  d = sd["wte.weight"].shape[1]
  hd = d // n_head
  n_layer = len({k.split(".")[1] for k in sd if k.startswith("h.")})
  x = sd["wte.weight"][tokens] + sd["wpe.weight"][np.arange(t)][None]
  mask = np.tril(np.ones((t, t), dtype=bool))
  for i in range(n_layer):
    p = lambda name: sd[f"h.{i}.{name}"]  # pylint: disable=cell-var-from-loop
    h = _np_layer_norm(x, p("ln_1.weight"), p("ln_1.bias"))
    qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")  # Conv1D.
    q, k, v = np.split(qkv, 3, axis=-1)
    split = lambda a: a.reshape(a.shape[0], t, n_head, hd).transpose(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    att = np.where(mask, att, np.finfo(np.float32).min)
    att = np.exp(att - att.max(-1, keepdims=True))
    att = att / att.sum(-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(x.shape)
    x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
    h = _np_layer_norm(x, p("ln_2.weight"), p("ln_2.bias"))
    h = _np_gelu_new(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
    x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
  x = _np_layer_norm(x, sd["ln_f.weight"], sd["ln_f.bias"])
  return x @ sd["wte.weight"].T  # Tied lm_head.


def random_hf_state_dict(cfg: gpt2.GPT2Config, seed: int = 0, std: float = 0.15):
  """Random HF-layout weights with non-trivial biases and LayerNorm params."""
  rng = np.random.default_rng(seed)
  d, sd = cfg.d_model, {}

  def normal(*shape, loc=0.0):
    return (loc + std * rng.normal(size=shape)).astype(np.float32)

  sd["transformer.wte.weight"] = normal(cfg.vocab_size, d)
  sd["transformer.wpe.weight"] = normal(cfg.n_ctx, d)
  for i in range(cfg.n_layer):
    pre = f"transformer.h.{i}."
    for ln in ("ln_1", "ln_2"):
      sd[pre + ln + ".weight"] = normal(d, loc=1.0)
      sd[pre + ln + ".bias"] = normal(d)
    for name, (n_in, n_out) in {
      "attn.c_attn": (d, 3 * d),
      "attn.c_proj": (d, d),
      "mlp.c_fc": (d, 4 * d),
      "mlp.c_proj": (4 * d, d),
    }.items():
      sd[pre + name + ".weight"] = normal(n_in, n_out)
      sd[pre + name + ".bias"] = normal(n_out)
  sd["transformer.ln_f.weight"] = normal(d, loc=1.0)
  sd["transformer.ln_f.bias"] = normal(d)
  return sd


# -----------------------------------------------------------------------------
# Config.
# -----------------------------------------------------------------------------


def test_presets_validate():
  for cfg in gpt2.PRESETS.values():
    cfg.validate()
  assert gpt2.PRESETS["tiny"].vocab_size == 256


@pytest.mark.parametrize(
  "changes, field",
  [
    ({"d_model": 100, "n_head": 3}, "model.d_model"),
    ({"n_layer": 0}, "model.n_layer"),
    ({"dropout": 1.0}, "model.dropout"),
    ({"dtype": "int8"}, "model.dtype"),
  ],
)
def test_config_validate_names_field(changes, field):
  with pytest.raises(ValueError, match=field):
    dataclasses.replace(MICRO, **changes).validate()


# -----------------------------------------------------------------------------
# Model.
# -----------------------------------------------------------------------------


def test_tiny_shapes(tiny_params):
  tokens = jnp.zeros((2, 16), jnp.int32)
  logits = gpt2.GPT2(TINY).apply({"params": tiny_params}, tokens)
  chex.assert_shape(logits, (2, 16, TINY.vocab_size))
  chex.assert_type(logits, jnp.float32)
  d = TINY.d_model
  chex.assert_shape(tiny_params["wte"]["embedding"], (TINY.vocab_size, d))
  chex.assert_shape(tiny_params["wpe"]["embedding"], (TINY.n_ctx, d))
  block = tiny_params["h_1"]
  chex.assert_shape(block["attn"]["c_attn"]["kernel"], (d, 3 * d))
  chex.assert_shape(block["mlp"]["c_fc"]["kernel"], (d, 4 * d))
  chex.assert_shape(block["mlp"]["c_proj"]["kernel"], (4 * d, d))
  assert set(tiny_params) == {"wte", "wpe", "h_0", "h_1", "ln_f"}


def test_124m_param_count_without_allocation():
  model = gpt2.GPT2(gpt2.PRESETS["124m"])
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
  assert gpt2.count_params(shapes["params"]) == 124_439_808


def test_too_long_sequence_raises():
  params = _init_micro()
  tokens = jnp.zeros((1, MICRO.n_ctx + 1), jnp.int32)
  with pytest.raises(ValueError, match="n_ctx"):
    gpt2.GPT2(MICRO).apply({"params": params}, tokens)


def test_causal_masking(tiny_params):
  model = gpt2.GPT2(TINY)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, TINY.vocab_size)
  pos = 7
  changed = tokens.at[:, pos].set((tokens[:, pos] + 1) % TINY.vocab_size)
  a = model.apply({"params": tiny_params}, tokens)
  b = model.apply({"params": tiny_params}, changed)
  chex.assert_trees_all_close(a[:, :pos], b[:, :pos], atol=1e-6, rtol=0)
  assert np.all(np.abs(np.asarray(a[:, pos:] - b[:, pos:])).max(-1) > 1e-5)


def test_init_statistics(tiny_params):
  resid_std = 0.02 / math.sqrt(2 * TINY.n_layer)
  for i in range(TINY.n_layer):
    block = tiny_params[f"h_{i}"]
    for kernel, want in [
      (block["attn"]["c_attn"]["kernel"], 0.02),
      (block["mlp"]["c_fc"]["kernel"], 0.02),
      (block["attn"]["c_proj"]["kernel"], resid_std),
      (block["mlp"]["c_proj"]["kernel"], resid_std),
    ]:
      np.testing.assert_allclose(np.std(kernel), want, rtol=0.1)
      assert abs(float(np.mean(kernel))) < 0.1 * want
    for name in ("ln_1", "ln_2"):
      np.testing.assert_array_equal(block[name]["scale"], 1.0)
      np.testing.assert_array_equal(block[name]["bias"], 0.0)
    np.testing.assert_array_equal(block["attn"]["c_attn"]["bias"], 0.0)
  for name in ("wte", "wpe"):
    np.testing.assert_allclose(np.std(tiny_params[name]["embedding"]), 0.02, rtol=0.1)


class JitTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_apply_variants_agree(self):
    model = gpt2.GPT2(MICRO)
    params = _init_micro()
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, MICRO.vocab_size)
    expected = model.apply({"params": params}, tokens)
    apply = self.variant(lambda p, t: model.apply({"params": p}, t))
    chex.assert_trees_all_close(apply(params, tokens), expected, atol=1e-5)


def test_loss_fn_and_dropout():
  cfg = dataclasses.replace(MICRO, dropout=0.1)
  model = gpt2.GPT2(cfg)
  params = _init_micro()
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, cfg.vocab_size)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  loss_fn = gpt2.make_loss_fn(model)
  loss, aux = loss_fn(params, batch)
  chex.assert_shape(loss, ())
  assert isinstance(aux, dict)
  # Near-uniform predictions at init.
  np.testing.assert_allclose(loss, math.log(cfg.vocab_size), rtol=0.05)
  # Deterministic without an rng; stochastic with one.
  np.testing.assert_array_equal(loss_fn(params, batch)[0], loss)
  dropped, _ = loss_fn(params, {**batch, "dropout_rng": jax.random.key(0)})
  assert float(dropped) != float(loss)


# -----------------------------------------------------------------------------
# Hugging Face conversion.
# -----------------------------------------------------------------------------


def test_hf_round_trip():
  params = _init_micro()
  sd = hf.to_hf_state_dict(params, MICRO)
  assert all(isinstance(v, np.ndarray) for v in sd.values())
  cfg, back = hf.from_hf_state_dict(sd, n_head=MICRO.n_head)
  assert cfg == MICRO
  chex.assert_trees_all_equal(back, params)
  chex.assert_trees_all_equal_dtypes(back, params)


def test_hf_round_trip_via_safetensors(tmp_path):
  params = _init_micro(seed=1)
  path = tmp_path / "model.safetensors"
  save_file(hf.to_hf_state_dict(params, MICRO), str(path))
  cfg, back = hf.load_hf_checkpoint(path, n_head=MICRO.n_head)
  assert cfg == MICRO
  chex.assert_trees_all_equal(back, params)
  # A directory holding model.safetensors works too.
  cfg, back = hf.load_hf_checkpoint(tmp_path, n_head=MICRO.n_head)
  chex.assert_trees_all_equal(back, params)


def test_hf_accepts_unprefixed_names_buffers_and_tied_lm_head():
  sd = random_hf_state_dict(MICRO)
  plain = {k.removeprefix("transformer."): v for k, v in sd.items()}
  plain["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
  plain["h.0.attn.masked_bias"] = np.float32(-1e4)
  plain["lm_head.weight"] = plain["wte.weight"].copy()
  _, a = hf.from_hf_state_dict(sd, n_head=MICRO.n_head)
  _, b = hf.from_hf_state_dict(plain, n_head=MICRO.n_head)
  chex.assert_trees_all_equal(a, b)


def test_hf_load_errors(tmp_path):
  sd = random_hf_state_dict(MICRO)
  missing = dict(sd)
  del missing["transformer.h.1.mlp.c_fc.bias"]
  with pytest.raises(ValueError, match=r"missing keys.*h\.1\.mlp\.c_fc\.bias"):
    hf.from_hf_state_dict(missing, n_head=MICRO.n_head)

  wrong = dict(sd)
  wrong["transformer.h.0.attn.c_proj.weight"] = np.zeros((32, 31), np.float32)
  with pytest.raises(ValueError, match=r"wrong shapes.*h\.0\.attn\.c_proj"):
    hf.from_hf_state_dict(wrong, n_head=MICRO.n_head)

  extra = {**sd, "transformer.h.0.attn.q_proj.weight": np.zeros((2,))}
  with pytest.raises(ValueError, match=r"unexpected keys.*q_proj"):
    hf.from_hf_state_dict(extra, n_head=MICRO.n_head)

  untied = {**sd, "lm_head.weight": sd["transformer.wte.weight"] + 1.0}
  with pytest.raises(ValueError, match="lm_head"):
    hf.from_hf_state_dict(untied, n_head=MICRO.n_head)

  with pytest.raises(ValueError, match="model.d_model"):
    hf.from_hf_state_dict(sd, n_head=5)

  with pytest.raises(FileNotFoundError, match="nope.safetensors"):
    hf.load_hf_checkpoint(tmp_path / "nope.safetensors")


def test_logits_match_numpy_reference():
  sd = random_hf_state_dict(MICRO, seed=3)
  cfg, params = hf.from_hf_state_dict(sd, n_head=MICRO.n_head)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.n_ctx))
  logits = gpt2.GPT2(cfg).apply({"params": params}, jnp.asarray(tokens))
  expected = np_gpt2_logits(sd, tokens, n_head=cfg.n_head)
  assert np.abs(expected).max() > 1.0  # The check is not vacuous.
  np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


# -----------------------------------------------------------------------------
# MLP.
# -----------------------------------------------------------------------------


def test_mlp_shapes_and_sgd_decreases_loss():
  x, y = mlp.make_regression_problem(seed=0, n_in=8, n_out=2, n=256)
  chex.assert_shape([x, y], [(256, 8), (256, 2)])
  x2, _ = mlp.make_regression_problem(seed=0, n_in=8, n_out=2, n=256)
  np.testing.assert_array_equal(x, x2)

  model = mlp.MLP(features=(32, 32), n_out=2)
  params = model.init(jax.random.key(0), x[:1])["params"]
  chex.assert_shape(model.apply({"params": params}, x), (256, 2))

  b1 = mlp.regression_batch(x, y, step=3, batch_size=64, seed=7)
  b2 = mlp.regression_batch(x, y, step=3, batch_size=64, seed=7)
  b3 = mlp.regression_batch(x, y, step=4, batch_size=64, seed=7)
  chex.assert_trees_all_equal(b1, b2)
  assert not np.array_equal(b1["x"], b3["x"])

  loss_fn = mlp.make_loss_fn(model)
  full = {"x": x, "y": y}

  @jax.jit
  def sgd_step(params, batch):
    grads, _ = jax.grad(loss_fn, has_aux=True)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

  initial, aux = loss_fn(params, full)
  assert aux == {}
  for step in range(30):
    params = sgd_step(params, mlp.regression_batch(x, y, step, 64, seed=0))
  final, _ = loss_fn(params, full)
  assert float(final) < 0.7 * float(initial)
