"""Per-sequence selective backprop (`hybrid.method='selective_backprop'`): real steps only.

Selective backprop (Jiang et al., 2019, "Accelerating deep learning by focusing on the biggest
losers") forwards more examples than it trains on and backpropagates only the hardest. Here each step
receives `BATCHES_PER_STEP` (2) of the task's batches, 2B sequences, scores every sequence with one
forward pass (`optim.per_example_losses`, no gradient), and takes the real step (forward and backward)
on the B with the highest loss. The control arm (`selective.random=True`) takes a uniformly random B
of the same 2B: the same cost and the same data, without the selection.

Costs are reported as performed: each step is one backward pass (`was_real`) plus the scoring
forward of 2B sequences, two forward passes of a B batch (`forwards=2`), which the benchmark charges
in its pass ratio; the B trained on are forwarded again inside the real step, as in the original
method, so the step's wall-clock is about 1 + 2/3 of a baseline step's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from hybridjax import schema
from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.real_step import baseline_step
from hybridjax.hybrid.state import HybridState
from hybridjax.optim import Batch, Schedule, per_example_losses

NAME = "selective_backprop"
CONFIG_KEY = "selective"
BATCHES_PER_STEP = 2  # the loop hands each step two of the task's batches, concatenated: 2B sequences
CONTROL = {"selective.random": True}  # the same 2B and the same cost, a random B backpropagated

# Any batch size works: a step receives BATCHES_PER_STEP whole batches and keeps one's worth, so the
# method has no check across fields.
FIELDS = (
  schema.Field("random", False, schema.check_bool, "True: the control arm, a random B of the 2B backpropagated"),
)


def make_settings(hybrid: ml_collections.ConfigDict, *, groups: groups_lib.ParamGroups) -> tuple[bool]:
  del groups
  return (bool(hybrid.selective.random),)


def control(hybrid: ml_collections.ConfigDict, settings: tuple[bool]) -> dict[str, Any]:
  del hybrid, settings
  return {"enable_predict": False}


def init(ctx: HybridContext, params: Any, rng: jax.Array) -> None:
  del ctx, params, rng
  return None  # stateless: the random control draws from the hybrid state's key and the step


def select(scores: jax.Array, keep: int, rng: jax.Array, random: bool) -> jax.Array:
  """(keep,) indices into `scores`: those of the `keep` highest, or `keep` drawn without replacement."""
  if random:
    return jax.random.permutation(rng, scores.shape[0])[:keep]
  return jax.lax.top_k(scores, keep)[1]


def full_step(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
  """Scores the 2B sequences of `batch`, then the baseline's real update on the chosen B."""
  tr = state.train
  sizes = {x.shape[0] for x in jax.tree.leaves(batch) if x.ndim >= 1}
  if len(sizes) != 1:
    raise ValueError(
      f"selective_backprop: the batch's leaves have leading axes {sorted(sizes)}; it needs one batch axis "
      "on every leaf that has axes (per-example losses are taken along it)"
    )
  (total,) = sizes
  scores = per_example_losses(ctx.loss_fn, jax.lax.stop_gradient(tr.params), batch)
  index = select(scores, total // BATCHES_PER_STEP, jax.random.fold_in(state.rng, tr.step), ctx.settings[0])
  # Every leaf with axes has `total` rows.
  new, info = baseline_step(ctx, state, jax.tree.map(lambda x: x[index] if x.ndim else x, batch), schedule)
  # The scoring forward of 2B sequences: two forwards of a B batch, charged beside the backward pass.
  return new, info.replace(
    forwards=jnp.asarray(BATCHES_PER_STEP, jnp.int32),
    extra={"scored_loss": jnp.mean(scores), "selected_loss": jnp.mean(scores[index])},
  )


def step_extra(ctx: HybridContext) -> dict[str, jax.Array]:
  del ctx
  return {"scored_loss": jnp.float32(0.0), "selected_loss": jnp.float32(0.0)}


def metrics(ctx: HybridContext, state: HybridState, info: StepInfo) -> dict[str, jax.Array]:
  """The mean loss of the 2B scored sequences and of the B trained on (their gap is the selection's
  strength; about zero for the random control)."""
  del ctx, state
  return dict(info.extra)  # `step_extra`'s fields


def step_kind(row: dict[str, Any]) -> str:
  del row
  return "selective_step"
