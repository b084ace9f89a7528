"""The built-in optimizers, each a declaration beside its builder: the `config.optim` fields it
reads (`schema.Field`s, each declared once beside the code that reads it: here, and the Adam
family's in `optimizers.adam`), what it is in words, and the function that builds it from a view
of only those fields (`schema.View`), so that a builder reading a field it does not declare fails in
the first test that builds it.

Everything that says which optimizer reads which field (the refusal of a field set but unread, the
default `optim` block, docs/config.md, the tests that change each field and watch the updates) is
computed from `OPTIMIZERS`. `make_optimizer` builds one by `optim.name`; `resolve_optimizer` takes a
user's optimizer (`train(tx=...)`) instead, whose learning rate the schedule drives through
`with_learning_rate`; the checks of a user's optimizer are `optimizers.user`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from hybridjax import schema
from hybridjax.optimizers import module
from hybridjax.optimizers.adam import (  # noqa: F401  (re-exported, as `hybridjax.optimizers.<name>`)
  ADAMW_EMBED_LR_RATIO,
  ADAMW_HEAD_LR_RATIO,
  ADAMW_LR_RATIOS,
  B1,
  B2,
  EPS,
  LION_B1,
  LION_B2,
  WEIGHT_DECAY,
  _adamw,
  _beta,
  _build_adam,
  _build_lion,
  _build_nadamw,
  _build_schedule_free_adamw,
  _positive,
  _tied_head,
  _with_group_ratios,
  adamw_group_labels,
  adamw_lr_ratios,
)
from hybridjax.optimizers.labels import muon_group_labels, muon_labels
from hybridjax.optimizers.user import (  # noqa: F401  (re-exported, as `hybridjax.optimizers.<name>`)
  Optimizer,
  _factory_with_learning_rate,
  _is_inject_state,
  injected_learning_rates,
  with_learning_rate,
)

F = schema.Field


def _blocks_of_three(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` applied to each (d, 3d) matrix seen as a batch of three (d, d) matrices (its q, k and
  v column blocks), and the result laid out as (d, 3d) again."""
  to = lambda x: x.reshape(x.shape[0], 3, x.shape[1] // 3).transpose(1, 0, 2)
  back = lambda x: x.transpose(1, 0, 2).reshape(x.shape[1], 3 * x.shape[2])

  def update(updates, state, params=None):
    params = None if params is None else jax.tree.map(to, params)
    updates, state = inner.update(jax.tree.map(to, updates), state, params)
    return jax.tree.map(back, updates), state

  return optax.GradientTransformation(lambda params: inner.init(jax.tree.map(to, params)), update)


def _stacks_of_three(params: Any) -> Any:
  """Muon on (3, d, d) stacks: axis 0 a batch, orthogonalised over axes 1 and 2."""
  return jax.tree.map(lambda _: optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2), params)


def _muon(
  learning_rate: Any, weight_decay: Any = None, beta: Any = None, batched: bool = False
) -> optax.GradientTransformation:
  """`optax.contrib.muon` with only the hyperparameters given (the rest: optax's defaults, beta 0.95,
  Nesterov, 5 Newton-Schulz steps, no weight decay), so `inject_hyperparams` injects no others (an
  injected `ns_steps` would be a traced array) and an optimizer built without a weight decay or a
  momentum keeps its earlier state layout. `batched`: on (3, d, d) stacks, axis 0 a batch,
  orthogonalised over axes 1 and 2."""
  given = {k: v for k, v in (("weight_decay", weight_decay), ("beta", beta)) if v is not None}
  dims = _stacks_of_three if batched else None
  return optax.contrib.muon(learning_rate=learning_rate, muon_weight_dimension_numbers=dims, **given)


# --- the fields, each beside what reads it ---------------------------------------------------------

GRAD_CLIP = F(
  "grad_clip",
  1.0,
  schema.check_num(0.0),
  "global-norm clipping before every built-in optimizer; 0 = none",
  other=0.5,
  in_your_optimizer="optax.chain(optax.clip_by_global_norm({value}), ...)",
)


def _untied_head(config: Any) -> str | None:
  """Unread on a GPT-2 model with a head of its own (`model.untied_head=True`): nothing is tied."""
  model = config.get("model") or {}
  if not model.get("untied_head", False):
    return None
  return (
    "--config.model.untied_head=True gives the model a head of its own (lm_head, in the head group at "
    "--config.optim.head_lr_ratio), so no parameter is tied to the head (optim.muon_group_labels). Set "
    "--config.model.untied_head=False to train with it"
  )


# 'muon': `_build_muon`.
ADAM_LR_RATIO = F(
  "adam_lr_ratio",
  0.15,
  _positive,
  "'muon': the AdamW group's LR as a ratio of learning_rate",
  other=0.3,
  roles=("adam lr",),
)
MUON_WEIGHT_DECAY = F(
  "muon_weight_decay",
  0.0,
  schema.check_num(0.0),
  "'muon'/'muon_groups': the Muon matrices' decoupled weight decay (times the lr)",
  other=0.1,
  roles=("weight decay",),
)
# 'muon_groups': `_build_muon_groups` (the speedrun record's ratios: Muon 0.05, embeddings 0.6,
# head 0.008, scalars 0.04; betas (0.8, 0.95), eps 1e-10).
_GROUPS_FIELDS = (
  F(
    "embed_lr_ratio",
    12.0,
    _positive,
    "'muon_groups': the embeddings' LR as a ratio of learning_rate",
    other=6.0,
    roles=("embed lr", "adam lr"),
  ),
  F(
    "head_lr_ratio",
    0.16,
    _positive,
    "'muon_groups': an untied head's LR as a ratio of learning_rate",
    other=0.5,
    roles=("head lr", "adam lr"),
    unread=_tied_head(
      "with --config.optim.tied_lr_ratio, tied_b1, tied_b2 and tied_eps (optim.tied_head_settings)",
      "Set --config.optim.tied_lr_ratio instead, or --config.model.untied_head=True for a head of its own",
    ),
  ),
  F(
    "scalar_lr_ratio",
    0.8,
    _positive,
    "'muon_groups': the scalars' LR as a ratio of learning_rate",
    other=0.4,
    roles=("adam lr",),
  ),
  F("groups_b1", 0.8, _beta, "'muon_groups': the Adam groups' b1", other=0.9, roles=("beta1",)),
  F("groups_b2", 0.95, _beta, "'muon_groups': the Adam groups' b2", other=0.99, roles=("beta2",)),
  F("groups_eps", 1e-10, _positive, "'muon_groups': the Adam groups' eps", other=1e-3, roles=("eps",)),
  F(
    "groups_lr_scale",
    1.0,
    _positive,
    "'muon_groups': multiplies every Adam group's ratio (embed, head, scalar, tied) at once",
    other=2.0,
    roles=("adam lr",),
  ),
  # 'muon_groups' with a token embedding tied to the head: its own Adam settings (`tied_head_settings`).
  # The defaults are the head group's, which it shared before it had its own; the records #3-#7 gave it
  # about 0.36 of Muon's rate, betas (0.9, 0.95), eps 1e-8 (the recipe's `muon` step sets those).
  F(
    "tied_lr_ratio", 0.16, _positive, "'muon_groups': a tied embedding-head's LR ratio", other=0.5, unread=_untied_head
  ),
  F("tied_b1", 0.8, _beta, "'muon_groups': a tied embedding-head's b1", other=0.5, unread=_untied_head),
  F("tied_b2", 0.95, _beta, "'muon_groups': a tied embedding-head's b2", other=0.99, unread=_untied_head),
  F("tied_eps", 1e-10, _positive, "'muon_groups': a tied embedding-head's eps", other=1e-3, unread=_untied_head),
)

MUON_MOMENTUM = 0.95
"""Muon's momentum by default (optax's default, the records'): `optim.muon_momentum`'s default."""


def _no_momentum_warmup(config: Any) -> str | None:
  if int(config.optim.get("muon_momentum_warmup_steps", 0)):
    return None
  return (
    "it is where Muon's momentum warm-up starts, and --config.optim.muon_momentum_warmup_steps=0 keeps the "
    f"momentum at --config.optim.muon_momentum={final_muon_momentum(config.optim)} throughout (optim.muon_momentum). "
    "Set --config.optim.muon_momentum_warmup_steps above 0 to warm up from it"
  )


# 'muon' and 'muon_groups': Muon's momentum, warmed up linearly from muon_momentum_start over
# muon_momentum_warmup_steps Muon updates (the records from #9: 0.85 to 0.95 over 500, later 300).
MUON_MOMENTUM_FIELD = F(
  "muon_momentum",
  MUON_MOMENTUM,
  schema.check_num(0.0, 1.0, lo_open=True, hi_open=True),
  "'muon'/'muon_groups': Muon's momentum (where a warm-up ends)",
  other=0.5,
)
_MUON_MOMENTUM = (
  MUON_MOMENTUM_FIELD,
  F(
    "muon_momentum_warmup_steps",
    0,
    schema.check_int(0),
    "'muon'/'muon_groups': Muon updates over which the momentum rises from muon_momentum_start; 0 = off",
    other=2,
  ),
  F(
    "muon_momentum_start",
    0.85,
    _beta,
    "'muon'/'muon_groups': where the momentum warm-up starts",
    other=0.5,
    unread=_no_momentum_warmup,
  ),
)


def final_muon_momentum(optim: Any) -> float:
  """Muon's momentum, `optim.muon_momentum` (where a warm-up ends); a block written before the field
  existed gives `MUON_MOMENTUM`, which it trained with."""
  return float(optim.get("muon_momentum", MUON_MOMENTUM))


def muon_momentum(optim: Any) -> Callable[[jax.Array], jax.Array] | float | None:
  """Muon's momentum: a function of the number of Muon updates so far during a warm-up, a float when
  constant and not `MUON_MOMENTUM`, or None when it is optax's default `MUON_MOMENTUM` throughout (the
  optimizer is then built as before the momentum was a field, with the same state and numbers).

  With `optim.muon_momentum_warmup_steps` = W > 0 the momentum goes linearly from
  `optim.muon_momentum_start` at the first update to `optim.muon_momentum` (m) at update W and stays
  there, as the records compute it from #9 on: `frac = min(step / W, 1); (1 - frac) * start + frac * m`.
  It counts the optimizer's own updates (a momentum averages the updates it has taken), which in a
  baseline run are its steps; a step skipped as non-finite is not one."""
  final = final_muon_momentum(optim)
  steps = int(optim.get("muon_momentum_warmup_steps", 0))
  if steps == 0:
    return None if final == MUON_MOMENTUM else final
  start = float(optim.muon_momentum_start)

  def momentum(count: jax.Array) -> jax.Array:
    frac = jnp.minimum(jnp.asarray(count, jnp.float32) / steps, 1.0)
    return (1 - frac) * start + frac * final

  return momentum


def _build_sgd(o: Any) -> optax.GradientTransformation:
  del o
  return optax.inject_hyperparams(optax.sgd)(learning_rate=0.0, momentum=0.9)


def _build_muon(o: Any) -> optax.GradientTransformation:
  """Muon (`muon_weight_decay`, `muon_momentum`) on `muon_labels`' matrices, AdamW at `adam_lr_ratio`
  times the rate on the rest: one injected learning rate per group, both set to the same value, the
  AdamW group's update scaled afterwards."""
  muon = optax.inject_hyperparams(_muon)(
    learning_rate=0.0, weight_decay=float(o.muon_weight_decay), beta=muon_momentum(o)
  )
  rest = optax.chain(_adamw(o), optax.scale(float(o.adam_lr_ratio)))
  return optax.partition({"muon": muon, "adamw": rest}, muon_labels)


def tied_head_settings(optim: Any) -> tuple[float, float, float, float]:
  """(LR ratio, b1, b2, eps) of a token embedding tied to the head under 'muon_groups':
  `optim.tied_lr_ratio`, `tied_b1`, `tied_b2`, `tied_eps`. A block without them (written before they
  existed) gives the head group's, which is what it trained with."""
  return tuple(
    float(optim[name] if name in optim else optim[fallback])
    for name, fallback in (
      ("tied_lr_ratio", "head_lr_ratio"),
      ("tied_b1", "groups_b1"),
      ("tied_b2", "groups_b2"),
      ("tied_eps", "groups_eps"),
    )
  )


def _build_muon_groups(o: Any) -> optax.GradientTransformation:
  """The speedrun's optimizer: Muon (`muon_weight_decay`, 0 in the records) on the hidden matrices, Adam on the
  embeddings, the head and the scalars (`muon_group_labels`), each Adam group at its own fixed ratio
  of the learning rate with `groups_b1`, `groups_b2`, `groups_eps`; a token embedding tied to the
  head at `tied_head_settings`; `groups_lr_scale` multiplies all of these ratios. As for 'muon', every
  group's injected learning rate is set to the one schedule's value, and an Adam group's update is
  scaled by its ratio after.

  A tied head whose settings are the untied head's shares its group ('head'): the optimizer state
  then has the layout it had before the tied head had settings of its own, and the same numbers."""
  b1, b2, eps = float(o.groups_b1), float(o.groups_b2), float(o.groups_eps)
  scale = float(o.groups_lr_scale)  # times 1.0 (the default) a ratio is exactly itself

  def adam(ratio, b1=b1, b2=b2, eps=eps):
    return optax.chain(
      optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=b1, b2=b2, eps=eps),
      optax.scale(float(ratio) * scale),
    )

  momentum, decay = muon_momentum(o), float(o.muon_weight_decay)
  muon = optax.inject_hyperparams(_muon)
  transforms = {
    "muon": muon(learning_rate=0.0, weight_decay=decay, beta=momentum),
    # The fused matrix's Muon gets a weight decay only when it is not 0: at 0 its state keeps the
    # layout (and the numbers) it had before 'muon_groups' read the field.
    "muon_qkv": _blocks_of_three(muon(learning_rate=0.0, weight_decay=decay or None, beta=momentum, batched=True)),
    "embed": adam(o.embed_lr_ratio),
    "head": adam(o.head_lr_ratio),
    "scalar": adam(o.scalar_lr_ratio),
  }
  tied = tied_head_settings(o)
  if tied != (float(o.head_lr_ratio), b1, b2, eps):
    transforms["tied_head"] = adam(*tied)
  tied_label = "tied_head" if "tied_head" in transforms else "head"
  return optax.partition(transforms, functools.partial(muon_group_labels, tied_label=tied_label))


@dataclasses.dataclass(frozen=True)
class BuiltinOptimizer:
  """A built-in optimizer: its name, what it is in words (for the refusals), the `config.optim` fields
  it reads (besides the schedule's and outer momentum's, which every run reads) and its builder, which
  gets a `schema.View` of only those. `owns_schedule`: it anneals on its own, so the config's schedule
  must hold the rate constant after its warm-up (`--config.optim.min_lr_ratio=1.0`)."""

  name: str
  summary: str
  fields: tuple[schema.Field, ...]
  build: Callable[[Any], optax.GradientTransformation]
  owns_schedule: bool = False


_ADAMW = (GRAD_CLIP, B1, B2, EPS, WEIGHT_DECAY)
_GROUP_RATIOS = (ADAMW_EMBED_LR_RATIO, ADAMW_HEAD_LR_RATIO)
OPTIMIZERS: dict[str, BuiltinOptimizer] = {
  o.name: o
  for o in (
    BuiltinOptimizer(
      "adamw",
      "AdamW: b1, b2, eps, weight_decay",
      (*_ADAMW, *_GROUP_RATIOS),
      _adamw,
    ),
    BuiltinOptimizer(
      "adam",
      "Adam: b1, b2, eps, and no weight decay",
      (GRAD_CLIP, B1, B2, EPS, *_GROUP_RATIOS),
      _build_adam,
    ),
    BuiltinOptimizer(
      "nadamw",
      "NAdamW (AdamW with Nesterov momentum): b1, b2, eps, weight_decay",
      (*_ADAMW, *_GROUP_RATIOS),
      _build_nadamw,
    ),
    BuiltinOptimizer(
      "lion",
      "Lion (the sign of an interpolated momentum): lion_b1, lion_b2, weight_decay",
      (GRAD_CLIP, LION_B1, LION_B2, WEIGHT_DECAY, *_GROUP_RATIOS),
      _build_lion,
    ),
    BuiltinOptimizer(
      "schedule_free_adamw",
      "schedule-free AdamW: b1 (its interpolation), b2, eps, weight_decay; evaluated at its average "
      "(`eval_params`); no per-group LR ratio, since its averaging weights depend on the LR",
      _ADAMW,
      _build_schedule_free_adamw,
      owns_schedule=True,
    ),
    BuiltinOptimizer(
      "sgd", "SGD with a fixed momentum of 0.9: no betas, eps or weight decay", (GRAD_CLIP,), _build_sgd
    ),
    BuiltinOptimizer(
      "muon",
      "Muon (muon_weight_decay) on the hidden matrices, AdamW (b1, b2, eps, weight_decay) at adam_lr_ratio on the rest",
      (*_ADAMW, ADAM_LR_RATIO, MUON_WEIGHT_DECAY, *_MUON_MOMENTUM),
      _build_muon,
    ),
    BuiltinOptimizer(
      "muon_groups",
      "Muon (muon_weight_decay) on the hidden matrices, and Adam with no weight decay on the "
      "embeddings, the head and the scalars, each at its own *_lr_ratio, with groups_b1, groups_b2, groups_eps",
      (GRAD_CLIP, *_GROUPS_FIELDS, MUON_WEIGHT_DECAY, *_MUON_MOMENTUM),
      _build_muon_groups,
    ),
  )
}

BUILTIN_OPTIMIZERS = tuple(OPTIMIZERS)
"""The names `make_optimizer` builds from `config.optim`; any other `optim.name` names a user's optimizer."""

FIELDS: tuple[schema.Field, ...] = tuple({f.name: f for o in OPTIMIZERS.values() for f in o.fields}.values())
"""Every field some built-in optimizer reads, once each, in declaration order."""


def make_optimizer(optim: Any) -> optax.GradientTransformation:
  """The built-in optimizer named by `optim.name` (`OPTIMIZERS`), built from a view of the fields it
  declares, with global-norm clipping at `optim.grad_clip` (0 = off) in front.

  The learning rate is an injected hyperparameter whose value `with_learning_rate` sets before
  each update (in every group); it is never a schedule of the optimizer's own update count.
  """
  decl = OPTIMIZERS.get(optim.name)
  if decl is None:
    raise ValueError(
      f"--config.optim.name={optim.name!r} is not a built-in optimizer {BUILTIN_OPTIMIZERS}: use one of them, "
      "or pass an optimizer of your own to `train(tx=...)` under this name"
    )
  if error := lr_ratio_error(optim):
    raise ValueError(error)
  view = schema.View(optim, decl.fields, owner=f"optimizer {optim.name!r}")
  core = decl.build(view)
  if ADAMW_EMBED_LR_RATIO in decl.fields:  # the embed and head groups' LR ratios (`_with_group_ratios`)
    core = _with_group_ratios(core, view)
  if view.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(float(view.grad_clip)), core)
  return core


def lr_ratio_error(optim: Any) -> str | None:
  """The group LR ratios (`ADAMW_LR_RATIOS`) set away from 1.0 under an optimizer that does not declare
  them (a user's never does), or None: the one statement of which optimizers read them."""
  ratios = adamw_lr_ratios(optim)
  decl = OPTIMIZERS.get(optim.name)
  if ratios == (1.0, 1.0) or (decl is not None and ADAMW_EMBED_LR_RATIO in decl.fields):
    return None
  readers = [o.name for o in OPTIMIZERS.values() if ADAMW_EMBED_LR_RATIO in o.fields]
  set_ = [f"--config.optim.{f}={r}" for f, r in zip(ADAMW_LR_RATIOS, ratios) if r != 1.0]
  two = len(set_) > 1
  return (
    f"{' and '.join(set_)} {'apply' if two else 'applies'} only to an optimizer that declares "
    f"{'them' if two else 'it'} ({', '.join(repr(r) for r in readers)}), not {optim.name!r} "
    f"({decl.summary if decl else 'your own optimizer'}): set {'them' if two else 'it'} back to 1.0, or use one "
    "of those ('muon_groups' has its own --config.optim.embed_lr_ratio and head_lr_ratio)"
  )


def schedule_error(optim: Any) -> str | None:
  """The refusal of a decaying schedule under an optimizer that owns its schedule
  (`BuiltinOptimizer.owns_schedule`), or None."""
  decl = OPTIMIZERS.get(optim.name)
  floor = float(optim.get("min_lr_ratio", 1.0))
  if decl is None or not decl.owns_schedule or floor == 1.0:
    return None
  return (
    f"--config.optim.min_lr_ratio={floor} decays the rate, but --config.optim.name={optim.name!r} owns its "
    "schedule (it averages its iterates in place of a decay, weighted by the rate): set "
    "--config.optim.min_lr_ratio=1.0 to hold the rate constant after the warm-up"
  )


def eval_params(opt_state: Any, params: Any) -> Any:
  """The params a run is evaluated and averaged at: schedule-free's average (`optax.contrib.
  schedule_free_eval_params`) where the optimizer state holds one, else `params` themselves."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_schedule_free) if _is_schedule_free(s)]
  return optax.contrib.schedule_free_eval_params(found[0], params) if found else params


def _is_schedule_free(node: Any) -> bool:
  return isinstance(node, optax.contrib.ScheduleFreeState)


def relation_errors(optim: Any, steps: int | None) -> list[str]:
  """The problems of an optim block's optimizer fields together (`steps`: the run's length, or None):
  a Muon setting with an optimizer that has no Muon, the group LR ratios with one that does not read
  them, a decaying schedule with one that owns its schedule, the
  scale of 'muon_groups' Adam groups with another, a momentum warm-up longer than the run or
  starting above the momentum. Each names the field and the fix."""
  name = optim.name
  errors = [e for e in (lr_ratio_error(optim), schedule_error(optim)) if e]
  final = final_muon_momentum(optim)
  has_muon = name in OPTIMIZERS and MUON_MOMENTUM_FIELD in OPTIMIZERS[name].fields
  if final != MUON_MOMENTUM and not has_muon:
    errors.append(
      f"--config.optim.muon_momentum ({final}) is Muon's momentum, but --config.optim.name={name!r} has no "
      f"Muon: set --config.optim.name to 'muon' or 'muon_groups', or the momentum back to {MUON_MOMENTUM}"
    )
  scale = float(optim.get("groups_lr_scale", 1.0))
  if scale != 1.0 and name != "muon_groups":
    errors.append(
      f"--config.optim.groups_lr_scale ({scale}) scales the Adam groups of 'muon_groups', but --config.optim.name="
      f"{name!r}: set --config.optim.name='muon_groups', or the scale back to 1.0"
    )
  warm = optim.get("muon_momentum_warmup_steps", 0)
  if not warm:
    return errors
  if not has_muon:  # Muon's momentum warm-up: a Muon optimizer, and a run it fits in
    errors.append(
      f"--config.optim.muon_momentum_warmup_steps ({warm}) warms up Muon's momentum, but --config.optim.name="
      f"{name!r} has no Muon: set --config.optim.name to 'muon' or 'muon_groups', or the warm-up to 0"
    )
  if steps is not None and warm > steps:
    errors.append(
      f"--config.optim.muon_momentum_warmup_steps ({warm}) is longer than the run (--config.trainer.steps="
      f"{steps}): the momentum would never reach --config.optim.muon_momentum ({final}); use at most {steps} "
      "steps, or 0 for no warm-up"
    )
  if optim.muon_momentum_start > final:
    errors.append(
      f"--config.optim.muon_momentum_start ({optim.muon_momentum_start}) is above --config.optim.muon_momentum "
      f"({final}): the warm-up rises from the start to the momentum; set the start at most {final}, or "
      "--config.optim.muon_momentum_warmup_steps=0 for no warm-up"
    )
  return errors


def resolve_optimizer(optim: Any, params: Any, tx: Optimizer | None = None) -> optax.GradientTransformation:
  """The optimizer of a run: `make_optimizer(optim)` when `tx` is None, else the user's `tx`; a user's
  module's (`optimizers.module`) when `optim` holds its block.

  The config's schedule (`optim.learning_rate`, `optim.schedule`, ...) drives the learning rate of
  every run, through `with_learning_rate`. So a user's transformation must have its learning rate
  injected (`optax.inject_hyperparams`); a factory `learning_rate -> tx` is wrapped so that it is.
  The user's optimizer is part of what a run is: `optim.name` must name it, with a name that is not
  a built-in one, so that the config record, the checkpoint's config check and the benchmark's run
  cache tell two optimizers apart.

  Args:
    optim: the `config.optim` block.
    params: the params (or their `jax.ShapeDtypeStruct`s) the optimizer will be initialised on.
    tx: None, an `optax.GradientTransformation` with an injected `learning_rate`, or a factory.

  Raises:
    ValueError: naming the field and the fix, when `tx` and `optim.name` disagree, or when the
      schedule cannot drive `tx`'s learning rate.
  """
  if tx is None and module.BLOCK in optim:  # a user's optimizer module (`optimizers.module`)
    tx = module.factory(optim)
  if tx is None:
    return make_optimizer(optim)
  if optim.name in BUILTIN_OPTIMIZERS:
    raise ValueError(
      f"train(tx=...) got an optimizer of your own, but --config.optim.name={optim.name!r} names a built-in "
      "one: set config.optim.name to a name for your optimizer (e.g. 'my_adamw'). It goes into the run's "
      "config record and the checkpoint's config check, so that runs with different optimizers are never "
      "mistaken for each other"
    )
  if not isinstance(tx, optax.GradientTransformation):
    if not callable(tx):
      raise ValueError(
        f"train(tx=...) takes an optax.GradientTransformation or a factory learning_rate -> "
        f"GradientTransformation, got {type(tx).__name__}"
      )
    tx = optax.inject_hyperparams(_factory_with_learning_rate(tx))(learning_rate=0.0)
  if not injected_learning_rates(tx, params):
    raise ValueError(
      f"the optimizer {optim.name!r} given to train(tx=...) has no injected learning rate, so the schedule "
      f"(--config.optim.schedule={optim.schedule!r}, peak --config.optim.learning_rate={optim.learning_rate}) "
      "cannot drive it and would be silently ignored. Pass a factory instead, e.g. "
      "`tx=lambda learning_rate: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate))`, or "
      "build it with `optax.inject_hyperparams(optax.adamw)(learning_rate=0.0)`"
    )
  return tx
