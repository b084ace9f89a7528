"""The speedrun's architecture options of the GPT-2 and its grouped optimizer: each option does what
the record's code does (a known value, a shape, or what zero initialisation implies), impossible
combinations are refused naming the field, and with every option off the model computes what it
computed before the options existed (tests/data/gpt2_plain_reference.npz)."""

from __future__ import annotations

import dataclasses
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import TEST_DATA

from experiments.configs import gpt2_small
from hybridjax import config as config_lib
from hybridjax import optim, optimizers, preflight
from hybridjax.models import gpt2, hf

REFERENCE = os.path.join(TEST_DATA, "gpt2_plain_reference.npz")
BASE = gpt2.GPT2Config(vocab_size=256, n_ctx=16, n_layer=2, n_head=2, d_model=32)
TOKENS = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256)
ALL_ON = dict(
  rotary=True,
  qk_norm=True,
  relu2=True,
  rmsnorm=True,
  embed_norm=True,
  zero_init_proj=True,
  untied_head=True,
  logit_softcap=15.0,
  embed_skips=True,
  value_embeds=1,
  unet_skips=True,
)


def _model(**options):
  cfg = dataclasses.replace(BASE, **options)
  model = gpt2.GPT2(cfg)
  return model, model.init(jax.random.PRNGKey(0), TOKENS)["params"]


def _logits(model, params):
  return jax.jit(lambda p: model.apply({"params": p}, TOKENS))(params)


def test_with_every_option_off_the_model_computes_the_reference():
  """The reference was written by the model before the options existed: logits, loss and every
  gradient agree to float32 rounding (compiled here, eager there; the change itself was checked
  bit for bit, eager against eager, when it was made)."""
  ref = np.load(REFERENCE)
  model, params = _model()
  batch = {"inputs": TOKENS, "targets": jnp.roll(TOKENS, -1, 1)}
  (loss, _), grads = jax.jit(jax.value_and_grad(gpt2.make_loss_fn(model), has_aux=True))(params, batch)
  got = {"logits": _logits(model, params), "loss": loss}
  got |= {"grad/" + "/".join(k.key for k in p): v for p, v in jax.tree_util.tree_leaves_with_path(grads)}
  assert set(got) == set(ref.files)
  chex.assert_trees_all_close(got, {k: ref[k] for k in ref.files}, rtol=1e-6, atol=1e-7)


def test_every_option_on_trains_and_its_params_are_the_records():
  model, params = _model(**ALL_ON)
  assert "wpe" not in params  # rotary: no learned positions
  chex.assert_shape(params["lm_head"], (32, 256))
  chex.assert_shape(params["skip_weights"], (1,))
  chex.assert_shape(params["value_embed_0"]["embedding"], (256, 32))
  for i in range(2):  # the one table goes into the first and the last layer
    chex.assert_shape(params[f"h_{i}"]["attn"]["value_lambdas"], (2,))
    chex.assert_shape(params[f"h_{i}"]["lambdas"], (2,))
  # RMSNorm without parameters and no biases.
  for path, _ in jax.tree_util.tree_leaves_with_path(params):
    keys = [k.key for k in path]
    assert "bias" not in keys and "scale" not in keys, keys
  logits = _logits(model, params)
  chex.assert_shape(logits, (2, 16, 256))
  chex.assert_trees_all_close(logits, jnp.zeros_like(logits))  # the zero-initialised head


def test_untied_zero_head_starts_at_the_uniform_loss():
  model, params = _model(untied_head=True)
  batch = {"inputs": TOKENS, "targets": jnp.roll(TOKENS, -1, 1)}
  loss, _ = gpt2.make_loss_fn(model)(params, batch)
  chex.assert_trees_all_close(loss, jnp.log(256.0), rtol=1e-6)


def test_zero_init_projections_make_every_block_the_identity():
  """With both output projections at zero, a block adds nothing: the logits are the final norm of
  the embedding against the tied embedding."""
  model, params = _model(zero_init_proj=True)
  for i in range(2):
    for part in ("attn", "mlp"):
      assert not np.any(params[f"h_{i}"][part]["c_proj"]["kernel"])
  x = params["wte"]["embedding"][TOKENS] + params["wpe"]["embedding"][jnp.arange(16)][None]
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  h = (x - mean) / jnp.sqrt(var + BASE.layer_norm_eps) * params["ln_f"]["scale"] + params["ln_f"]["bias"]
  chex.assert_trees_all_close(_logits(model, params), h @ params["wte"]["embedding"].T, rtol=1e-5, atol=1e-5)


def test_logit_softcap_is_cap_tanh_of_the_plain_logits():
  plain, params = _model()
  capped, _ = _model(logit_softcap=0.5)
  want = 0.5 * jnp.tanh(_logits(plain, params) / 0.5)
  chex.assert_trees_all_close(_logits(capped, params), want, rtol=1e-6, atol=1e-7)
  assert float(jnp.abs(_logits(capped, params)).max()) < 0.5


def test_rotary_rotates_pairs_by_position_so_scores_depend_on_the_offset():
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 1, 8, 16))
  r = gpt2.rotate(x, 10000.0)
  chex.assert_shape(r, x.shape)
  chex.assert_trees_all_close(r[..., 0, :], x[..., 0, :])  # position 0 is not rotated
  half = lambda a: jnp.sqrt(a[..., :8] ** 2 + a[..., 8:] ** 2)
  chex.assert_trees_all_close(half(r), half(x), rtol=1e-5)  # each pair keeps its length
  # <q_m, k_n> after rotation depends on m - n only: one vector at every position.
  q = jnp.broadcast_to(x[..., :1, :], x.shape)
  s = jnp.einsum("bhqd,bhkd->bhqk", gpt2.rotate(q, 10000.0), gpt2.rotate(q, 10000.0))[0, 0]
  chex.assert_trees_all_close(s[3, 1], s[7, 5], rtol=1e-5)
  chex.assert_trees_all_close(s[2, 2], s[6, 6], rtol=1e-5)


def test_qk_norm_makes_the_scores_blind_to_the_scale_of_q_and_k():
  model, params = _model(qk_norm=True, rmsnorm=True)  # no biases: q and k scale with their columns
  scaled = jax.tree.map(lambda x: x, params)
  kernel = params["h_0"]["attn"]["c_attn"]["kernel"]
  scaled["h_0"]["attn"]["c_attn"]["kernel"] = kernel.at[:, :64].multiply(7.0)  # q and k columns
  # Equal up to the norm's epsilon, which weighs less at the larger scale.
  chex.assert_trees_all_close(_logits(model, scaled), _logits(model, params), atol=2e-4)
  plain, _ = _model(rmsnorm=True)
  assert float(jnp.abs(_logits(plain, scaled) - _logits(plain, params)).max()) > 1e-2


def test_relu2_is_the_square_of_the_relu():
  cfg = dataclasses.replace(BASE, relu2=True)
  mlp = gpt2.MLPBlock(cfg)
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 4, 32))
  p = mlp.init(jax.random.PRNGKey(0), x, deterministic=True)["params"]
  h = x @ p["c_fc"]["kernel"] + p["c_fc"]["bias"]
  want = jnp.maximum(h, 0) ** 2 @ p["c_proj"]["kernel"] + p["c_proj"]["bias"]
  chex.assert_trees_all_close(mlp.apply({"params": p}, x, deterministic=True), want, rtol=1e-5, atol=1e-6)


def test_rms_norm_has_unit_root_mean_square():
  x = 3.0 * jax.random.normal(jax.random.PRNGKey(0), (4, 64)) + 1.0
  y = gpt2.rms_norm(x, 1e-6)
  chex.assert_trees_all_close(jnp.sqrt(jnp.mean(y**2, -1)), jnp.ones(4), rtol=1e-5)


def _plain_plus(init, params, **set_blocks):
  """`params` of the plain model with the leaves only `init` has added, the blocks' ones overridden
  by `set_blocks` (name -> value, set wherever the block has that leaf)."""
  merged = jax.tree.map(lambda x: x, params)
  for key, leaf in init.items():
    if key not in merged:
      merged[key] = leaf
  for i in range(BASE.n_layer):
    block = init[f"h_{i}"]
    for name, value in set_blocks.items():
      if name in block:
        merged[f"h_{i}"][name] = value
      if name in block["attn"]:
        merged[f"h_{i}"]["attn"][name] = value
  return merged


def test_embedding_skips_start_at_the_plain_model_and_mix_in_the_embedding():
  plain, params = _model()
  model, init = _model(embed_skips=True)
  chex.assert_trees_all_close(init["h_0"]["lambdas"], jnp.array([1.0, 0.0]))
  same = _plain_plus(init, params, lambdas=jnp.array([1.0, 0.0]))
  chex.assert_trees_all_close(_logits(model, same), _logits(plain, params), rtol=1e-5, atol=1e-6)
  assert not np.allclose(
    _logits(model, _plain_plus(init, params, lambdas=jnp.array([1.0, 1.0]))), _logits(plain, params)
  )


def test_unet_skips_with_zero_weights_are_the_plain_model():
  plain, params = _model()
  model, init = _model(unet_skips=True)
  chex.assert_trees_all_close(init["skip_weights"], jnp.ones(1))
  same = _plain_plus(init, params) | {"skip_weights": jnp.zeros(1)}
  chex.assert_trees_all_close(_logits(model, same), _logits(plain, params), rtol=1e-5, atol=1e-6)
  assert not np.allclose(_logits(model, _plain_plus(init, params)), _logits(plain, params))


def test_value_embeddings_mix_into_the_values_with_learned_lambdas():
  plain, params = _model()
  model, init = _model(value_embeds=1)
  chex.assert_trees_all_close(init["h_1"]["attn"]["value_lambdas"], jnp.array([0.5, 0.5]))
  same = _plain_plus(init, params, value_lambdas=jnp.array([1.0, 0.0]))
  chex.assert_trees_all_close(_logits(model, same), _logits(plain, params), rtol=1e-5, atol=1e-6)
  mixed = _plain_plus(init, params, value_lambdas=jnp.array([0.5, 0.5]))
  assert not np.allclose(_logits(model, mixed), _logits(plain, params))


def test_value_embedding_tables_go_to_the_first_and_the_last_layers():
  cfg = dataclasses.replace(BASE, n_layer=6, value_embeds=2)
  assert [gpt2.value_embed_layer(cfg, i) for i in range(6)] == [0, 1, None, None, 0, 1]


# ----------------------------------------------------------------------------
# The records' initialisation, attention scale and value residual.
# ----------------------------------------------------------------------------

WIDE = gpt2.GPT2Config(vocab_size=256, n_ctx=8, n_layer=2, n_head=2, d_model=64)


def _wide(**options):
  cfg = dataclasses.replace(WIDE, **options)
  return gpt2.GPT2(cfg).init(jax.random.PRNGKey(0), TOKENS[:, :8])["params"]


@pytest.mark.parametrize("init, std_times_root_fan_in", [("fan_in", 1 / np.sqrt(3)), ("fan_in_0.5", 0.5)])
def test_the_records_init_draws_each_matrix_uniformly_at_its_fan_in_scale(init, std_times_root_fan_in):
  """Under 'fan_in' (PyTorch's `nn.Linear` default, the records to #19) a matrix is U(±1/√fan_in),
  std 1/√(3 fan_in): at width 64, c_attn's std is 1/√(3·64) = 0.0722 and the MLP's output projection's
  (fan-in 256) 1/√(3·256) = 0.0361. Under 'fan_in_0.5' (record #20) the std is 0.5/√fan_in. The tied
  token embedding is the records' tied head (fan-in d_model); a bound of √3 std holds every entry."""
  p = _wide(init=init)
  for leaf, fan_in in [
    (p["h_0"]["attn"]["c_attn"]["kernel"], 64),
    (p["h_1"]["attn"]["c_proj"]["kernel"], 64),
    (p["h_0"]["mlp"]["c_fc"]["kernel"], 64),
    (p["h_1"]["mlp"]["c_proj"]["kernel"], 256),
    (p["wte"]["embedding"], 64),
  ]:
    std = std_times_root_fan_in / np.sqrt(fan_in)
    chex.assert_trees_all_close(float(jnp.std(leaf)), std, rtol=0.03)
    assert float(jnp.max(jnp.abs(leaf))) <= np.sqrt(3) * std * (1 + 1e-6)
    assert abs(float(jnp.mean(leaf))) < 0.05 * std
  # GPT-2's init is width-independent: N(0, 0.02), whatever d_model.
  chex.assert_trees_all_close(float(jnp.std(_wide()["h_0"]["attn"]["c_attn"]["kernel"])), 0.02, rtol=0.03)


def test_under_the_records_init_every_other_table_is_unit_normal_and_zeroed_weights_stay_zero():
  """An untied token embedding, the positions and the value-embedding tables are PyTorch's
  `nn.Embedding` default, N(0, 1) (50x GPT-2's 0.02); the untied head and the zero-initialised
  projections stay zero; biases stay zero."""
  p = _wide(init="fan_in", untied_head=True, value_embeds=1, zero_init_proj=True)
  for table in (p["wte"]["embedding"], p["wpe"]["embedding"], p["value_embed_0"]["embedding"]):
    chex.assert_trees_all_close(float(jnp.std(table)), 1.0, rtol=0.05)
  assert not np.any(p["lm_head"]) and not np.any(p["h_0"]["mlp"]["c_proj"]["kernel"])
  assert not np.any(p["h_0"]["attn"]["c_attn"]["bias"])


def test_a_model_trained_from_the_records_init_still_converts_to_hugging_face():
  cfg = dataclasses.replace(BASE, init="fan_in")
  params = gpt2.GPT2(cfg).init(jax.random.PRNGKey(0), TOKENS)["params"]
  state = hf.to_hf_state_dict(params, cfg)
  chex.assert_trees_all_close(state["transformer.wte.weight"], np.asarray(params["wte"]["embedding"]))


def test_the_attention_scale_multiplies_the_scores():
  """Scaling the query and key columns by c multiplies every score by c², as a scale c² times GPT-2's
  1/√head_dim does (no biases, no QK-norm: q and k scale with their columns). The default 0 is GPT-2's
  1/√head_dim."""
  plain, params = _model(rmsnorm=True)
  c = 1.7
  scaled = jax.tree.map(lambda x: x, params)
  for i in range(2):
    kernel = params[f"h_{i}"]["attn"]["c_attn"]["kernel"]
    scaled[f"h_{i}"]["attn"]["c_attn"]["kernel"] = kernel.at[:, :64].multiply(c)
  model, _ = _model(rmsnorm=True, attn_scale=c**2 / np.sqrt(BASE.head_dim))
  chex.assert_trees_all_close(_logits(model, params), _logits(plain, scaled), rtol=1e-5, atol=1e-6)
  default, _ = _model(rmsnorm=True, attn_scale=1 / np.sqrt(BASE.head_dim))
  chex.assert_trees_all_close(_logits(default, params), _logits(plain, params), rtol=1e-5, atol=1e-6)
  assert float(gpt2.attention_scale(BASE)) == pytest.approx(1 / 4)  # head_dim 16


@pytest.mark.parametrize("learned, shape", [("layer", ()), ("head", (2,))])
def test_a_learned_attention_scale_starts_at_the_fixed_one_and_is_a_parameter(learned, shape):
  fixed, params = _model(qk_norm=True, attn_scale=0.6)
  model, init = _model(qk_norm=True, attn_scale=0.6, learned_attn_scale=learned)
  for i in range(2):
    chex.assert_trees_all_close(init[f"h_{i}"]["attn"]["attn_scale"], jnp.full(shape, 0.6))
  same = _plain_plus(init, params, attn_scale=init["h_0"]["attn"]["attn_scale"])
  chex.assert_trees_all_close(_logits(model, same), _logits(fixed, params), rtol=1e-6, atol=1e-6)
  other = _plain_plus(init, params, attn_scale=jnp.full(shape, 2.0))
  assert not np.allclose(_logits(model, other), _logits(fixed, params))
  assert optim.muon_group_labels(init)["h_0"]["attn"]["attn_scale"] == "scalar"  # on Adam, not Muon


def test_the_value_residual_mixes_the_first_layers_values_into_the_later_layers():
  """Record #9's v = (1 - l) v + l v1, l learned from 0.5: the first layer has no lambda (v1 is its
  own v); l = 0 is the plain model; on the attention alone (no biases: the output is linear in v),
  v1 = 2 v at l = 0.25 gives v' = 0.75 v + 0.5 v = 1.25 v, so 1.25 times the output."""
  plain, params = _model(rmsnorm=True)
  model, init = _model(rmsnorm=True, value_residual=True)
  assert "value_residual_lambda" not in init["h_0"]["attn"]
  chex.assert_trees_all_close(init["h_1"]["attn"]["value_residual_lambda"], jnp.asarray(0.5))
  same = _plain_plus(init, params, value_residual_lambda=jnp.asarray(0.0))
  chex.assert_trees_all_close(_logits(model, same), _logits(plain, params), rtol=1e-5, atol=1e-6)
  mixed = _plain_plus(init, params, value_residual_lambda=jnp.asarray(0.5))
  assert not np.allclose(_logits(model, mixed), _logits(plain, params))
  cfg = dataclasses.replace(BASE, rmsnorm=True, value_residual=True)
  attn = gpt2.CausalSelfAttention(cfg)
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 32))
  p = attn.init(jax.random.PRNGKey(0), x, None, jnp.zeros((2, 2, 8, 16)), deterministic=True)["params"]
  y, v = attn.apply({"params": p}, x, None, None, deterministic=True)
  chex.assert_shape(v, (2, 2, 8, 16))
  y_own, _ = attn.apply({"params": p}, x, None, v, deterministic=True)  # v1 = v: the first block's case
  chex.assert_trees_all_close(y_own, y, rtol=1e-5, atol=1e-6)
  p = p | {"value_residual_lambda": jnp.asarray(0.25)}
  y_mixed, _ = attn.apply({"params": p}, x, None, 2 * v, deterministic=True)
  chex.assert_trees_all_close(y_mixed, 1.25 * y, rtol=1e-5, atol=1e-6)


def test_an_older_runs_config_without_the_new_options_compares_equal():
  """A checkpoint's config written before the init, attention scale, value residual and the
  optimizer's tied-head and momentum warm-up fields existed means their defaults."""
  import json

  from hybridjax import checkpoint as ckpt_lib

  current = gpt2_small.get_config("tiny,micro")
  saved = json.loads(current.to_json())
  for name in ("init", "attn_scale", "learned_attn_scale", "value_residual"):
    del saved["model"][name]
  for name in ("tied_lr_ratio", "tied_b1", "tied_b2", "tied_eps", "muon_momentum_warmup_steps", "muon_momentum_start"):
    del saved["optim"][name]
  assert ckpt_lib.config_differences(saved, current) == []
  current.model.init = "fan_in"
  assert ckpt_lib.config_differences(saved, current) == ["model.init: checkpoint has 'gpt2', config has 'fan_in'"]


@pytest.mark.parametrize(
  "options, field",
  [
    ({"rotary": True, "n_head": 32}, "model.rotary"),  # head dimension 1
    ({"unet_skips": True, "n_layer": 3}, "model.unet_skips"),
    ({"value_embeds": 2, "n_layer": 3}, "model.value_embeds"),
    ({"logit_softcap": -1.0}, "model.logit_softcap"),
    ({"relu2": "yes"}, "model.relu2"),
    ({"attn_scale": -0.12}, "model.attn_scale"),
    ({"learned_attn_scale": "per_token"}, "model.learned_attn_scale"),
    ({"init": "xavier"}, "model.init"),
    ({"value_residual": True, "n_layer": 1}, "model.value_residual"),
  ],
)
def test_an_impossible_option_is_refused_naming_the_field(options, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    dataclasses.replace(BASE, **options).validate()
  if not all(type(v) is type(getattr(BASE, k)) for k, v in options.items()):
    return  # the config's own types refuse it before validation does
  c = gpt2_small.get_config("tiny,micro")
  c.model.update(options)
  with pytest.raises(ValueError, match="--config." + field.replace(".", r"\.")):
    preflight.validate(c)


def test_a_model_with_options_does_not_convert_to_hugging_face():
  model, params = _model(rotary=True)
  with pytest.raises(ValueError, match="no Hugging Face GPT-2 equivalent"):
    hf.to_hf_state_dict(params, model.config)


# ----------------------------------------------------------------------------
# The grouped optimizer ('muon_groups').
# ----------------------------------------------------------------------------


def test_the_groups_follow_the_record():
  _, tied = _model(rmsnorm=True)
  _, untied = _model(**ALL_ON)
  lt, lu = optim.muon_group_labels(tied), optim.muon_group_labels(untied)
  assert lt["wte"]["embedding"] == "head" and lt["wpe"]["embedding"] == "embed"  # the tied head
  assert lu["wte"]["embedding"] == "embed" and lu["lm_head"] == "head"
  assert lu["value_embed_0"]["embedding"] == "embed" and lu["skip_weights"] == "scalar"
  assert lu["h_0"]["attn"]["c_attn"]["kernel"] == "muon_qkv" and lu["h_0"]["mlp"]["c_fc"]["kernel"] == "muon"
  assert lu["h_0"]["attn"]["value_lambdas"] == "scalar" and lu["h_1"]["lambdas"] == "scalar"
  assert optim.muon_labels(untied)["lm_head"] == "adamw"  # plain Muon keeps the head off Muon too


def test_muon_orthogonalises_a_fused_qkv_matrix_block_by_block():
  g = jax.random.normal(jax.random.PRNGKey(3), (16, 48))
  whole = optimizers._blocks_of_three(optimizers._muon(1.0, batched=True))
  u, _ = whole.update(g, whole.init(g), g)
  one = optax.contrib.muon(1.0)
  parts = [one.update(g[:, 16 * i : 16 * (i + 1)], one.init(g[:, :16]), g[:, :16])[0] for i in range(3)]
  chex.assert_trees_all_close(u, jnp.concatenate(parts, 1), rtol=1e-5, atol=1e-6)


def test_each_adam_group_steps_at_its_ratio_of_the_learning_rate():
  o = config_lib.default_optim_config()
  o.update(name="muon_groups", grad_clip=0.0, embed_lr_ratio=3.0, head_lr_ratio=0.5, scalar_lr_ratio=2.0)
  _, params = _model(**ALL_ON)
  tx = optim.make_optimizer(o)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  state = optim.with_learning_rate(tx.init(params), 0.01)
  updates, _ = jax.jit(tx.update)(grads, state, params)
  labels = optim.muon_group_labels(params)
  ratio = {"embed": 3.0, "head": 0.5, "scalar": 2.0}
  for u, label in zip(jax.tree.leaves(updates), jax.tree.leaves(labels)):
    if label in ratio:  # one Adam step from zero moments moves each entry by lr * ratio (the sign's)
      adam = optax.adam(0.01 * ratio[label], b1=0.8, b2=0.95, eps=1e-10)
      want, _ = adam.update(jnp.full_like(u, 0.1), adam.init(u))
      chex.assert_trees_all_close(u, want, rtol=1e-5)
