"""GPT-2 in Flax (linen), parameter-compatible with Hugging Face ``GPT2LMHeadModel``.

The architecture follows HF GPT-2 exactly: learned token (``wte``) and position
(``wpe``) embeddings, pre-LayerNorm transformer blocks with a fused ``c_attn``
projection and a tanh-approximated GELU MLP, a final ``ln_f`` and output logits
tied to ``wte``. Parameter names map 1:1 onto HF names, and dense kernels use
the (in, out) layout of HF's ``Conv1D``, so conversion (`models.hf`) is a pure renaming.

Parameters are always float32; ``GPT2Config.dtype`` selects the compute dtype.
Attention softmax and the output logits are computed in float32. ``GPT2Config.attention`` chooses
the attention's path (`models.attention`: the einsum, or ``jax.nn.dot_product_attention``'s XLA or
cuDNN kernel) and ``GPT2Config.loss_chunk`` the training loss's (`models.lm_loss`); both leave the
parameters as they are.

The modded-nanogpt speedrun's architecture changes are options of ``GPT2Config``, each one setting
named as the speedrun's record history names it (rotary embeddings, QK-norm, ReLU², RMSNorm
without parameters and no biases, zero-initialised projections, an untied zero-initialised head,
logit soft-capping, embedding skips, the value residual, value embeddings, U-net skips, a fixed or
learned attention scale, the records' initialisation). All are off by default, and then the model
is the Hugging Face GPT-2, computing the same bits as without the options (docs/recipe.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hybridjax import schema
from hybridjax.models import attention as attention_lib
from hybridjax.models import layers, lm_loss
from hybridjax.optim import Batch, LossFn

Params = dict[str, Any]

_COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
INITS = ("gpt2", "fan_in", "fan_in_0.5")
"""`GPT2Config.init`'s choices: GPT-2's, the records' up to #19 (PyTorch's defaults), record #20's."""
LEARNED_ATTN_SCALES = ("none", "layer", "head")
"""`GPT2Config.learned_attn_scale`'s choices."""


_int, _num = schema.check_int, schema.check_num


def _checked(check: schema.Check, default: Any = dataclasses.MISSING, option: bool = False) -> Any:
  """A field of `GPT2Config` with its check (`schema.check_*`), which `GPT2Config.validate` and a
  run's pre-flight (`FIELDS`, as `--config.model.<name>`) both apply; `option`: one of the
  speedrun's architecture options (`OPTIONS`)."""
  return dataclasses.field(default=default, metadata={"check": check, "option": option})


def _option(check: schema.Check = schema.check_bool, default: Any = False) -> Any:
  """A field of `GPT2Config` that is one of the speedrun's options (`OPTIONS`); a switch, off, unless told."""
  return _checked(check, default, option=True)


@dataclasses.dataclass(frozen=True)
class GPT2Config:
  """Hyper-parameters of a GPT-2 model.

  Attributes:
    vocab_size: number of token ids.
    n_ctx: maximum sequence length (number of learned positions).
    n_layer: number of transformer blocks.
    n_head: number of attention heads.
    d_model: width of the residual stream.
    dropout: dropout rate for embeddings, attention weights and residuals.
    layer_norm_eps: LayerNorm epsilon.
    dtype: compute dtype name ("float32", "bfloat16" or "float16"); parameters
      are always stored in float32.
    attention: the attention's path (`models.attention`): 'einsum' (the model's own, float32 scores;
      the only one with attention dropout), 'xla' or 'cudnn' (``jax.nn.dot_product_attention``'s),
      or 'auto': cuDNN on an NVIDIA GPU in bfloat16/float16, XLA's on other accelerators, the einsum
      on CPU and with dropout. The run's checkpoints record the path taken (``attention``).
    loss_chunk: the training loss's cross entropy is computed this many positions of the sequence at
      a time from the final hidden state and the head (`models.lm_loss`), never holding the whole
      (batch, time, vocab) float32 logits; 0 = over the whole logits at once. ``apply`` returns the
      logits either way.
    rotary: rotary position embeddings on the queries and keys, in place of the learned
      positions (no ``wpe``); needs an even head dimension.
    rotary_base: the rotary frequencies' base.
    qk_norm: RMSNorm (without parameters) on each head's queries and keys.
    relu2: the MLP's activation is ReLU², in place of tanh-GELU.
    rmsnorm: RMSNorm without parameters in place of every LayerNorm, and no biases anywhere.
    embed_norm: the token embedding is RMS-normalised before the first block.
    zero_init_proj: the attention and MLP output projections start at zero.
    untied_head: a separate output head (``lm_head``, zero-initialised) in place of the tied
      token embedding.
    logit_softcap: logits become ``cap * tanh(logits / cap)``; 0 = off.
    embed_skips: each block's input is ``l0 * x + l1 * x0``, with ``x0`` the (normalised)
      embedding and learned scalars ``lambdas`` starting at (1, 0).
    value_embeds: k extra embedding tables; table j is mixed into the attention values of layer j
      and of layer n_layer - k + j (``v = l0 * v + l1 * ve``, learned ``value_lambdas`` starting
      at (0.5, 0.5)); needs 2k <= n_layer. 0 = off.
    unet_skips: the first half's block outputs are added, last first, into the second half's
      inputs with learned weights starting at 1 (``skip_weights``); needs an even n_layer.
    value_residual: the first layer's attention values are mixed into every later layer's,
      ``v = (1 - l) * v + l * v1``, with a learned scalar ``value_residual_lambda`` per layer
      starting at 0.5 (record #9); needs n_layer >= 2. With value embeddings too, the residual
      is mixed in first.
    attn_scale: the factor on the query-key scores; 0 = 1/sqrt(head_dim), GPT-2's. Record #20 fixed
      it (0.12 at head_dim 128), because QK-norm bounds the scores by attn_scale * head_dim.
    learned_attn_scale: 'none' (the scale is fixed), 'layer' (a learned scalar ``attn_scale`` per
      attention layer, as record #20's README describes trying) or 'head' (one per head, shape
      (n_head,)); it starts at attn_scale's value (its default 1/sqrt(head_dim) for 0).
    init: the initial weights. 'gpt2': GPT-2's, N(0, 0.02) for every matrix and table, the
      residual projections N(0, 0.02 / sqrt(2 n_layer)). 'fan_in': PyTorch's defaults, which the
      records use up to #19: each matrix U(+-1/sqrt(fan_in)) (std 1/sqrt(3 fan_in)), a tied token
      embedding as the head it is (fan_in = d_model), every other embedding table (an untied token
      embedding, positions, value embeddings) N(0, 1). 'fan_in_0.5': record #20's, the same with
      each matrix U(+-sqrt(3) * 0.5/sqrt(fan_in)) (std 0.5/sqrt(fan_in)). Biases start at zero and
      zero-initialised weights (``zero_init_proj``, the untied head) at zero under every init.

  The fields from ``rotary`` on are the speedrun's options (`OPTIONS`), all off by default: the
  Hugging Face GPT-2.
  """

  vocab_size: int = _checked(_int(2, 65535))  # token ids are stored as uint16 (`data`)
  n_ctx: int = _checked(_int(1))
  n_layer: int = _checked(_int(1))
  n_head: int = _checked(_int(1))
  d_model: int = _checked(_int(1))
  dropout: float = _checked(_num(0.0, 1.0, hi_open=True), 0.0)
  layer_norm_eps: float = _checked(_num(0.0, lo_open=True), 1e-5)
  dtype: str = _checked(schema.check_choice(*_COMPUTE_DTYPES), "float32")
  attention: str = _checked(schema.check_choice(*attention_lib.ATTENTIONS), "auto")
  loss_chunk: int = _checked(_int(0), 0)
  rotary: bool = _option()
  rotary_base: float = _option(_num(1.0, lo_open=True), 10000.0)
  qk_norm: bool = _option()
  relu2: bool = _option()
  rmsnorm: bool = _option()
  embed_norm: bool = _option()
  zero_init_proj: bool = _option()
  untied_head: bool = _option()
  logit_softcap: float = _option(_num(0.0), 0.0)
  embed_skips: bool = _option()
  value_embeds: int = _option(_int(0), 0)
  unet_skips: bool = _option()
  value_residual: bool = _option()
  attn_scale: float = _option(_num(0.0), 0.0)
  learned_attn_scale: str = _option(schema.check_choice(*LEARNED_ATTN_SCALES), "none")
  init: str = _option(schema.check_choice(*INITS), "gpt2")

  def validate(self) -> None:
    """Raises ValueError naming each invalid field: its declared check (`FIELDS`), else the relations
    (`relation_errors`)."""
    values = dataclasses.asdict(self)
    schema.raise_invalid(schema.errors("model", FIELDS, values) or relation_errors(values))

  @property
  def speedrun_options(self) -> list[str]:
    """The speedrun options that are on (empty for the Hugging Face GPT-2)."""
    return [f.name for f in dataclasses.fields(self) if f.metadata["option"] and getattr(self, f.name) != f.default]

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_head


OPTIONS = tuple(f.name for f in dataclasses.fields(GPT2Config) if f.metadata.get("option"))
"""The speedrun's architecture options of `GPT2Config`, all off by default."""
FIELDS: tuple[schema.Field, ...] = tuple(
  schema.Field(f.name, f.default, f.metadata["check"], "") for f in dataclasses.fields(GPT2Config)
)
"""The `model` block's fields, as every block declares them (`default` is `dataclasses.MISSING` for a
size the model cannot default; the docs are `GPT2Config`'s `Attributes:`)."""


def relation_errors(model: Mapping[str, Any]) -> list[str]:
  """The problems of a model block (a mapping of the `GPT2Config` fields, each valid alone) across
  its fields: the heads, the attention path (`attention.attention_errors`) and the speedrun options
  in combination. Each names the field and the fix."""
  get = model.get
  n_layer, n_head, d_model, k = model["n_layer"], model["n_head"], model["d_model"], get("value_embeds", 0)
  if d_model % n_head:
    return [f"model.d_model ({d_model}) must be divisible by model.n_head ({n_head})"]
  errors = attention_lib.attention_errors(dict(model))
  head_dim = d_model // n_head
  if get("rotary") and head_dim % 2:
    errors.append(
      f"model.rotary needs an even head dimension, but model.d_model / model.n_head = {d_model} / {n_head} = "
      f"{head_dim}: change model.n_head or model.d_model, or set model.rotary=False"
    )
  if get("unet_skips") and n_layer % 2:
    errors.append(
      f"model.unet_skips pairs the first half's layers with the second half's, so it needs an even "
      f"model.n_layer, got {n_layer}: use an even layer count or set model.unet_skips=False"
    )
  if get("value_residual") and n_layer < 2:
    errors.append(
      f"model.value_residual mixes the first layer's values into the later layers', so it needs model.n_layer >= 2, "
      f"got {n_layer}: add a layer or set model.value_residual=False"
    )
  if 2 * k > n_layer:
    errors.append(
      f"model.value_embeds={k} mixes each table into a layer of the first {k} and of the last {k}, which needs "
      f"2 * value_embeds <= model.n_layer ({n_layer}): use model.value_embeds <= {n_layer // 2}"
    )
  return errors


PRESETS: dict[str, GPT2Config] = {
  # Byte-level; trains in a few minutes on a 2-core CPU.
  "tiny": GPT2Config(vocab_size=256, n_ctx=128, n_layer=2, n_head=4, d_model=128),
  # Byte-level; under an hour on CPU.
  "small": GPT2Config(vocab_size=256, n_ctx=256, n_layer=4, n_head=4, d_model=256),
  # GPT-2 Small (124,439,808 parameters), for a GPU.
  "124m": GPT2Config(vocab_size=50257, n_ctx=1024, n_layer=12, n_head=12, d_model=768),
}


# ----------------------------------------------------------------------------
# Model.
# ----------------------------------------------------------------------------

_STD = 0.02
# The variance of a matrix's entries times its fan-in, under each fan-in init: U(+-1/sqrt(fan_in))
# has variance 1/(3 fan_in) (PyTorch's `nn.Linear` default); record #20's std 0.5/sqrt(fan_in) 1/4.
_FAN_IN_VARIANCE = {"fan_in": 1.0 / 3.0, "fan_in_0.5": 0.25}


def _matrix_init(cfg: GPT2Config, std: float, in_axis: int = -2, out_axis: int = -1) -> nn.initializers.Initializer:
  """A matrix's init under `cfg.init`: N(0, `std`) for 'gpt2', else uniform with the fan-in variance
  (the fan-in is the size of `in_axis`)."""
  if cfg.init == "gpt2":
    return nn.initializers.normal(std)
  return nn.initializers.variance_scaling(_FAN_IN_VARIANCE[cfg.init], "fan_in", "uniform", in_axis, out_axis)


def _dense(features: int, name: str, cfg: GPT2Config):
  # The residual projections (`c_proj`, as GPT-2 names them) start at N(0, 0.02 / sqrt(2 n_layer)) under
  # 'gpt2', and at zero with `zero_init_proj`.
  residual = name == "c_proj"
  std = _STD / math.sqrt(2 * cfg.n_layer) if residual else _STD
  return layers.Dense(
    features,
    use_bias=not cfg.rmsnorm,
    dtype=jnp.dtype(cfg.dtype),
    param_dtype=jnp.float32,
    kernel_init=nn.initializers.zeros if residual and cfg.zero_init_proj else _matrix_init(cfg, std),
    bias_init=nn.initializers.zeros,
    name=name,
  )


def _embedding_init(cfg: GPT2Config, name: str) -> nn.initializers.Initializer:
  """An embedding table's init: N(0, 0.02) under 'gpt2'; under the records' inits a token embedding
  tied to the head is the head's matrix (a (vocab, d) table whose fan-in is d, as the records' tied
  `lm_head`), and every other table PyTorch's `nn.Embedding` default, N(0, 1)."""
  if cfg.init == "gpt2":
    return nn.initializers.normal(_STD)
  if name == "wte" and not cfg.untied_head:
    return _matrix_init(cfg, _STD, in_axis=-1, out_axis=-2)
  return nn.initializers.normal(1.0)


def rms_norm(x: jax.Array, eps: float) -> jax.Array:
  """RMSNorm without parameters over the last axis, computed in float32 (as `F.rms_norm`)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)).astype(x.dtype)


def _layer_norm(name: str, cfg: GPT2Config):
  if cfg.rmsnorm:
    return lambda x: rms_norm(x, cfg.layer_norm_eps)
  return nn.LayerNorm(
    epsilon=cfg.layer_norm_eps,
    dtype=jnp.dtype(cfg.dtype),
    param_dtype=jnp.float32,
    use_fast_variance=False,
    name=name,
  )


def rotate(x: jax.Array, base: float, time_axis: int = -2) -> jax.Array:
  """Rotary position embedding of `x` (batch, heads, time, head_dim; time on `time_axis`): the pairs
  (i, i + head_dim/2) rotated by position * base^(-2i/head_dim), as the speedrun's `Rotary` does."""
  t, dim = x.shape[time_axis], x.shape[-1]
  # (t, dim / 2), with a 1 for each axis between time and head_dim: (t, 1, dim / 2) for (batch, time, heads, head_dim)
  inv_freq = (1.0 / base) ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  freqs = jnp.outer(jnp.arange(t, dtype=jnp.float32), inv_freq).reshape(t, *[1] * (x.ndim - 2 - time_axis % x.ndim), -1)
  cos, sin = jnp.cos(freqs).astype(x.dtype), jnp.sin(freqs).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], axis=-1)


def _constant(value: Any) -> nn.initializers.Initializer:
  """The init of a learned float32 parameter that starts at `value` (broadcast to its shape)."""
  return lambda _, shape: jnp.broadcast_to(jnp.asarray(value, jnp.float32), shape)


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention with a fused qkv projection; with the speedrun's options,
  value embeddings mixed into the values, QK-norm and rotary embeddings (in the speedrun's order)."""

  config: GPT2Config

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    value_embed: jax.Array | None = None,
    first_values: jax.Array | None = None,
    *,
    deterministic: bool,
  ) -> tuple[jax.Array, jax.Array]:
    """(output, values): the block's attention output, and its values as projected (before any
    mixing), which the first layer's call hands to the later layers as `first_values` (the value
    residual's v1)."""
    cfg = self.config
    b, t, d = x.shape
    implementation = attention_lib.attention_implementation(cfg, attention_lib.current_backend())
    fused = implementation != "einsum"
    qkv = _dense(3 * d, "c_attn", cfg)(x)

    # The einsum's heads are transposed ahead of time, (b, h, t, head_dim): the batch dimensions of
    # both batched matmuls lead, and XLA:CPU runs them, and their gradients, faster
    # (docs/performance.md). The fused paths take (b, t, h, head_dim).
    def heads(a: jax.Array) -> jax.Array:
      a = a.reshape(b, t, cfg.n_head, cfg.head_dim)
      return a if fused else a.transpose(0, 2, 1, 3)

    q, k, v = (heads(a) for a in jnp.split(qkv, 3, axis=-1))
    projected = v
    if first_values is not None:  # record #9: v = (1 - l) v + l v1, l learned from 0.5
      lam = self.param("value_residual_lambda", _constant(0.5), ())
      v = ((1 - lam) * v + lam * first_values).astype(v.dtype)
    if value_embed is not None:
      lambdas = self.param("value_lambdas", _constant((0.5, 0.5)), (2,))
      v = (lambdas[0] * v + lambdas[1] * heads(value_embed)).astype(v.dtype)
    if cfg.qk_norm:
      q, k = rms_norm(q, cfg.layer_norm_eps), rms_norm(k, cfg.layer_norm_eps)
    if cfg.rotary:
      q, k = (rotate(a, cfg.rotary_base, 1 if fused else 2) for a in (q, k))
    if fused:
      scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
      if cfg.learned_attn_scale != "none":  # cuDNN's scale is a Python float: the learned one scales q
        learned = attention_scale(cfg, self)  # per head (n_head, 1, 1), reshaped to q's (n_head, 1)
        q, scale = (q * (learned.reshape(-1, 1) if learned.ndim else learned)).astype(q.dtype), 1.0
      y = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation=implementation)
    else:
      scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
      if cfg.attn_scale == 0 and cfg.learned_attn_scale == "none":
        scores = scores / jnp.sqrt(jnp.float32(cfg.head_dim))  # GPT-2's, the same bits as before the option
      else:
        scores = scores * attention_scale(cfg, self)
      scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), scores, jnp.finfo(jnp.float32).min)  # causal
      weights = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
      weights = nn.Dropout(cfg.dropout)(weights, deterministic=deterministic)
      y = jnp.einsum("bhqk,bhkd->bhqd", weights, v).transpose(0, 2, 1, 3)
    y = _dense(d, "c_proj", cfg)(y.reshape(b, t, d))  # (b, t, h, head_dim) -> (b, t, d)
    return nn.Dropout(cfg.dropout)(y, deterministic=deterministic), projected


def attention_scale(cfg: GPT2Config, module: nn.Module | None = None) -> jax.Array:
  """The factor on the query-key scores: `cfg.attn_scale` (1/sqrt(head_dim) for 0), fixed, or as a
  learned parameter of `module` starting there (`learned_attn_scale`: a scalar per layer, or
  (n_head, 1, 1) per head), in float32."""
  value = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
  if cfg.learned_attn_scale == "none" or module is None:
    return jnp.float32(value)
  shape = () if cfg.learned_attn_scale == "layer" else (cfg.n_head,)
  scale = module.param("attn_scale", _constant(value), shape)
  return scale if cfg.learned_attn_scale == "layer" else scale[:, None, None]


class MLPBlock(nn.Module):
  """Position-wise feed-forward network: d -> 4d -> d with tanh GELU (ReLU² with `relu2`)."""

  config: GPT2Config

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    cfg = self.config
    h = _dense(4 * cfg.d_model, "c_fc", cfg)(x)
    h = jnp.square(nn.relu(h)) if cfg.relu2 else nn.gelu(h, approximate=True)
    h = _dense(cfg.d_model, "c_proj", cfg)(h)
    return nn.Dropout(cfg.dropout)(h, deterministic=deterministic)


class Block(nn.Module):
  """Pre-norm transformer block; with `embed_skips` its input first mixes in the embedding `x0`."""

  config: GPT2Config

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    x0: jax.Array | None = None,
    value_embed: jax.Array | None = None,
    first_values: jax.Array | None = None,
    *,
    deterministic: bool,
  ) -> tuple[jax.Array, jax.Array]:
    """(output, the attention's projected values): see `CausalSelfAttention`."""
    cfg = self.config
    if cfg.embed_skips:
      lambdas = self.param("lambdas", _constant((1.0, 0.0)), (2,))
      x = (lambdas[0] * x + lambdas[1] * x0).astype(x.dtype)
    attn = CausalSelfAttention(cfg, name="attn")
    y, values = attn(_layer_norm("ln_1", cfg)(x), value_embed, first_values, deterministic=deterministic)
    x = x + y
    return x + MLPBlock(cfg, name="mlp")(_layer_norm("ln_2", cfg)(x), deterministic=deterministic), values


def value_embed_layer(cfg: GPT2Config, layer: int) -> int | None:
  """The value-embedding table layer `layer` mixes in (the first k layers take tables 0..k-1, the
  last k the same tables again), or None."""
  k, n = cfg.value_embeds, cfg.n_layer
  if layer < k:
    return layer
  if layer >= n - k:
    return layer - (n - k)
  return None


class GPT2(nn.Module):
  """GPT-2 language model returning float32 logits of shape (B, T, vocab).

  Dropout is active only with ``deterministic=False`` and ``config.dropout > 0``
  and then needs a ``'dropout'`` rng. With ``features=True`` it returns, in place of the logits, what
  they are computed from: the final (normalised) hidden state (B, T, d) and the head (vocab, d), both
  in the compute dtype (the chunked loss's inputs, `models.lm_loss`); the soft-cap is not applied.
  """

  config: GPT2Config

  @nn.compact
  def __call__(
    self, tokens: jax.Array, *, deterministic: bool = True, features: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    cfg = self.config
    cfg.validate()
    if tokens.ndim != 2:
      raise ValueError(f"tokens must have shape (batch, seq), got {tokens.shape}")
    t = tokens.shape[1]
    if t > cfg.n_ctx:
      raise ValueError(f"sequence length {t} exceeds the context size model.n_ctx ({cfg.n_ctx})")
    dtype = jnp.dtype(cfg.dtype)
    embed = lambda n, name: nn.Embed(
      n,
      cfg.d_model,
      dtype=dtype,
      param_dtype=jnp.float32,
      embedding_init=_embedding_init(cfg, name),
      name=name,
    )
    wte = embed(cfg.vocab_size, "wte")
    x = wte(tokens)
    if not cfg.rotary:  # with rotary embeddings positions enter through the queries and keys instead
      x = x + embed(cfg.n_ctx, "wpe")(jnp.arange(t))[None]
    if cfg.embed_norm:
      x = rms_norm(x, cfg.layer_norm_eps)
    x = nn.Dropout(cfg.dropout)(x, deterministic=deterministic)
    x0 = x if cfg.embed_skips else None
    values = [embed(cfg.vocab_size, f"value_embed_{j}")(tokens) for j in range(cfg.value_embeds)]
    half = cfg.n_layer // 2
    skips = []
    first_values = None
    for i in range(cfg.n_layer):
      if cfg.unet_skips and i >= half:
        if i == half:
          skip_weights = self.param("skip_weights", nn.initializers.ones, (half,), jnp.float32)  # n_layer is even
        x = (x + skip_weights[i - half] * skips.pop()).astype(x.dtype)
      table = value_embed_layer(cfg, i)
      ve = None if table is None else values[table]
      x, projected = Block(cfg, name=f"h_{i}")(x, x0, ve, first_values, deterministic=deterministic)
      if cfg.value_residual and i == 0:
        first_values = projected
      if cfg.unet_skips and i < half:
        skips.append(x)
    x = _layer_norm("ln_f", cfg)(x)
    if cfg.untied_head:  # x @ head, head (d, vocab)
      head = self.param("lm_head", nn.initializers.zeros, (cfg.d_model, cfg.vocab_size), jnp.float32).T
    else:
      head = wte.embedding
    head = head.astype(dtype)
    if features:
      return x, head
    return layers.tied_logits(x, head, cfg.logit_softcap)


def count_params(params: Any) -> int:
  """Total number of scalars in a parameter tree (arrays or ShapeDtypeStructs)."""
  return sum(int(leaf.size) for leaf in jax.tree.leaves(params))


def make_loss_fn(model: GPT2) -> LossFn:
  """Returns ``loss_fn(params, batch) -> (loss, aux)`` for next-token prediction.

  ``batch`` holds ``inputs`` and ``targets``, both (B, T) int32. The loss is the
  mean token cross-entropy: over the whole logits, or with ``model.config.loss_chunk`` a chunk of
  the sequence at a time (`lm_loss.chunked_cross_entropy`). The forward pass is deterministic unless
  the batch also holds a ``dropout_rng`` key (and the model has dropout > 0). ``aux`` is an empty dict.
  """
  cfg = model.config

  def loss_fn(params: Params, batch: Batch):
    rng = batch.get("dropout_rng")
    kwargs = {} if rng is None else {"deterministic": False, "rngs": {"dropout": rng}}
    out = model.apply({"params": params}, batch["inputs"], features=bool(cfg.loss_chunk), **kwargs)
    if cfg.loss_chunk:  # out: the final hidden state and the head
      return lm_loss.chunked_cross_entropy(*out, batch["targets"], cfg.loss_chunk, cfg.logit_softcap), {}
    return optax.softmax_cross_entropy_with_integer_labels(out, batch["targets"]).mean(), {}

  return loss_fn
