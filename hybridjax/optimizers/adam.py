"""AdamW and its family as built-in optimizers (Adam, NAdamW, Lion, schedule-free AdamW): their fields
(the betas, eps and weight decay, which 'muon' reads for its AdamW group too, Lion's betas, and the
embed and head LR ratios), each declared beside the code that reads it, and their builders. Each
decays the matrices only (`_decay_mask`)."""

from __future__ import annotations

from typing import Any

import jax
import optax

from hybridjax import schema
from hybridjax.optimizers.labels import muon_group_labels

F = schema.Field
_beta = schema.check_num(0.0, 1.0, hi_open=True)
_positive = schema.check_num(0.0, lo_open=True)

# AdamW's and Adam's (and the AdamW group of 'muon'): `_adamw`, `_adam`.
B1 = F(
  "b1",
  0.9,
  _beta,
  "Adam's first-moment decay",
  other=0.8,
  roles=("beta1",),
  in_your_optimizer="optax.adamw(learning_rate, b1={value})",
)
B2 = F(
  "b2",
  0.95,
  _beta,
  "Adam's second-moment decay",
  other=0.99,
  roles=("beta2",),
  in_your_optimizer="optax.adamw(learning_rate, b2={value})",
)
EPS = F(
  "eps",
  1e-8,
  _positive,
  "Adam's epsilon",
  other=1e-3,
  roles=("eps",),
  in_your_optimizer="optax.adamw(learning_rate, eps={value})",
)
WEIGHT_DECAY = F(
  "weight_decay",
  0.1,
  schema.check_num(0.0),
  "the decoupled weight decay (times the lr), matrices only",
  other=0.05,
  roles=("weight decay",),
  in_your_optimizer="optax.adamw(learning_rate, weight_decay={value})",
)


def _tied_head(trains: str, fix: str) -> schema.Unread:
  """Unread on a GPT-2 model whose head is tied to the token embedding (`model.untied_head=False`):
  no parameter is in the head group (`muon_group_labels`); the tied matrix trains as `trains` says."""

  def unread(config: Any) -> str | None:
    model = config.get("model") or {}
    if "untied_head" not in model or model["untied_head"]:
      return None
    return (
      f"--config.model.untied_head=False ties the head to the token embedding, which {config.optim.name!r} trains "
      f"{trains}: no parameter is in the head group. {fix}"
    )

  return unread


# Lion's (`_build_lion`): optax's and the paper's defaults.
LION_B1 = F("lion_b1", 0.9, _beta, "Lion's interpolation of the update's sign", other=0.95, roles=("beta1",))
LION_B2 = F("lion_b2", 0.99, _beta, "Lion's momentum decay", other=0.98, roles=("beta2",))


# The embeddings' and the head's LR as ratios of learning_rate (`_scale_groups`), read by every
# optimizer that declares them; refused with any other (`optimizers.lr_ratio_error`).
ADAMW_EMBED_LR_RATIO = F(
  "adamw_embed_lr_ratio",
  1.0,
  _positive,
  "the embeddings' LR (a tied head's too) as a ratio of learning_rate",
  other=2.0,
  roles=("embed lr",),
)
ADAMW_HEAD_LR_RATIO = F(
  "adamw_head_lr_ratio",
  1.0,
  _positive,
  "an untied head's LR as a ratio of learning_rate",
  other=2.0,
  roles=("head lr",),
  unread=_tied_head(
    "at --config.optim.adamw_embed_lr_ratio (optim.adamw_group_labels)",
    "Set --config.optim.adamw_embed_lr_ratio instead, or --config.model.untied_head=True for a head of its own",
  ),
)


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only: not on biases, LayerNorm parameters (ndim < 2)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


ADAMW_LR_RATIOS = (ADAMW_EMBED_LR_RATIO.name, ADAMW_HEAD_LR_RATIO.name)
"""The fields of `config.optim` that set the LR of the embeddings and of the head (`adamw_group_labels`),
as ratios of the learning rate; 1.0 by default."""


def adamw_lr_ratios(optim: Any) -> tuple[float, float]:
  """(`optim.adamw_embed_lr_ratio`, `optim.adamw_head_lr_ratio`); a block written before they existed
  gives 1.0, 1.0 (every parameter at the learning rate, which it trained with)."""
  return tuple(float(optim.get(name, 1.0)) for name in ADAMW_LR_RATIOS)


def adamw_group_labels(params: Any) -> Any:
  """'embed', 'head' or 'rest' for each leaf of `params`: the embed and head groups of
  `muon_group_labels` (a token embedding tied to the head is in 'embed'), and every other leaf."""
  groups = muon_group_labels(params, tied_label="embed")
  return jax.tree.map(lambda label: label if label in ("embed", "head") else "rest", groups)


def _scale_groups(embed_ratio: float, head_ratio: float) -> optax.GradientTransformation:
  """Multiplies the updates of the embed and head groups (`adamw_group_labels`) by their ratios. After
  AdamW, whose whole update (weight decay included) is proportional to its rate, that is AdamW at the
  ratio times the rate on the group; it keeps no state, so the Adam(W) state keeps its layout."""
  return optax.partition(
    {"embed": optax.scale(embed_ratio), "head": optax.scale(head_ratio), "rest": optax.identity()},
    adamw_group_labels,
  )


def _with_group_ratios(core: optax.GradientTransformation, o: Any) -> optax.GradientTransformation:
  """`core` with the embed and head ratios applied when either is not 1.0 (only then: at the defaults
  the optimizer is built as before the fields existed)."""
  ratios = adamw_lr_ratios(o)
  return optax.chain(core, _scale_groups(*ratios)) if ratios != (1.0, 1.0) else core


def _adamw(o: Any, factory: Any = optax.adamw) -> optax.GradientTransformation:
  """`factory` (optax's AdamW, or NAdamW) at the config's betas, eps and weight decay (matrices only)."""
  # Floats, whatever a config holds: an int hyperparameter would be injected as an int32 array.
  return optax.inject_hyperparams(factory, static_args=("mask",))(
    learning_rate=0.0,
    b1=float(o.b1),
    b2=float(o.b2),
    eps=float(o.eps),
    weight_decay=float(o.weight_decay),
    mask=_decay_mask,
  )


def _build_adam(o: Any) -> optax.GradientTransformation:
  return optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=float(o.b1), b2=float(o.b2), eps=float(o.eps))


def _build_nadamw(o: Any) -> optax.GradientTransformation:
  return _adamw(o, optax.nadamw)


def _build_lion(o: Any) -> optax.GradientTransformation:
  return optax.inject_hyperparams(optax.lion, static_args=("mask",))(
    learning_rate=0.0,
    b1=float(o.lion_b1),
    b2=float(o.lion_b2),
    weight_decay=float(o.weight_decay),
    mask=_decay_mask,
  )


def _schedule_free_adamw(learning_rate: Any, b1: Any, b2: Any, eps: Any, weight_decay: Any) -> Any:
  """`optax.contrib.schedule_free_adamw` (no warm-up of its own: the config's schedule warms the
  injected rate up) with its weight decay on the matrices only, which optax's does not mask."""
  base = optax.chain(
    optax.scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
    optax.add_decayed_weights(weight_decay, _decay_mask),
    optax.scale_by_learning_rate(learning_rate),
  )
  return optax.contrib.schedule_free(base, learning_rate=learning_rate, b1=b1)


def _build_schedule_free_adamw(o: Any) -> optax.GradientTransformation:
  return optax.inject_hyperparams(_schedule_free_adamw)(
    learning_rate=0.0, b1=float(o.b1), b2=float(o.b2), eps=float(o.eps), weight_decay=float(o.weight_decay)
  )
