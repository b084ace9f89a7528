"""The hybrid step: a method's three pure transitions, selected on the device.

Every training method (`hybridjax.methods`) gives three transitions, indexed by `Branch`:

  full_step      a real step: forward + backward + optimizer update, plus the method's bookkeeping
                 (WARMUP, FULL, CORRECT, micro-corrections in PREDICT); the baseline's by default
  predict_step   a step without a backward pass (the velocity predictor: theta <- theta +
                 sum_g alpha_{g,k} velocity_g; the jump predictor: a jump of k schedule steps)
  correct_step   the CORRECT entry (the velocity predictor: the exact rollback of what diverged);
                 the real step by default

`hybrid_step` runs the one `Controller.next_branch` names, then the controller transition
(`finish_step`); `hybrid_multi_step` runs K of them in one dispatch with `lax.scan`. The selection has
`lax.switch`'s semantics but updates the donated state in place (`switch_in_place`).
`make_phase_step` gives one transition plus the controller transition alone, for host dispatch.
Every function here is pure: jit it with the state donated (`donate_argnums=0`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hybridjax.hybrid import controller as controller_lib
from hybridjax.hybrid import state as state_lib
from hybridjax.hybrid.context import HybridContext, StepInfo, make_step_info
from hybridjax.hybrid.real_step import baseline_step
from hybridjax.hybrid.state import HybridState
from hybridjax.optim import Batch, Schedule, all_finite, init_outer_momentum, init_train_state

Transition = Callable[..., tuple[HybridState, StepInfo]]


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A transition that changes the state, then takes another transition:
  `then(ctx, prepare(ctx, state, batch, schedule), batch, schedule)`.

  The velocity predictor's `correct_step` is one: a rollback, then its `full_step`. Called, it is that
  composition. In the fused step (`switch_in_place`) `prepare` runs alone when this transition is
  selected, and `then`, when it is another branch's transition too, is compiled once and selected by
  both: a `correct_step` written as one function would put a second copy of the real step, the
  largest part of the program, into the step's trace and compile. `prepare` returns the whole
  `HybridState` with every leaf's shape and dtype unchanged.
  """

  prepare: Callable[[HybridContext, HybridState, Batch, Schedule], HybridState]
  then: Transition

  def __call__(
    self, ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
  ) -> tuple[HybridState, StepInfo]:
    return self.then(ctx, self.prepare(ctx, state, batch, schedule), batch, schedule)


def transitions(ctx: HybridContext) -> tuple[Transition, ...]:
  """The method's three transitions, indexed by `Branch`: its `full_step` (the baseline's,
  `real_step.baseline_step`, when it defines none), its `predict_step` behind the framework's
  non-finite guard (`discard_nonfinite`) and its `correct_step` (each the real step when it defines
  none: a real step guards its own update, `optim.guarded_update`)."""
  m = ctx.method
  real = m.full_step or baseline_step
  predict = discard_nonfinite(m.predict_step) if m.predict_step is not None else real
  return (real, predict, m.correct_step or real)


def discard_nonfinite(predict_step: Transition) -> Transition:
  """`predict_step`, discarded when it leaves a non-finite value in the params (or anything else of
  the train state) or in the method's state, as `optim.guarded_update` skips a real step's
  non-finite update. See `keep_if_finite`."""

  @functools.wraps(predict_step)
  def guarded(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule) -> tuple[HybridState, StepInfo]:
    after, info = predict_step(ctx, state, batch, schedule)
    return keep_if_finite(state, after, info)

  return guarded


def keep_if_finite(before: HybridState, after: HybridState, info: StepInfo) -> tuple[HybridState, StepInfo]:
  """(`after`, `info`) when every floating-point leaf the predicted step changed in the train state
  and the method's state is finite; else the state `before` it and `info` marked `discarded`.

  A discarded step is kept as a non-finite prediction: no move applied (alpha 0), the PREDICT phase
  ends (the controller goes to CORRECT and counts a non-finite event), and the method's
  `on_transition` sees `info.discarded` to undo at the CORRECT entry only what was applied before
  it. Of the state, only the schedule step moves on: by one when the step used its batch, as every
  step does (so the data position and the schedule stay in step with the host), not at all when it
  left its batch (a jump's probe). The params average does not take the step in.

  Only the leaves the step changed are checked and selected: a leaf it passed through is the same
  traced value (`is`), already finite or not before the step, and costs nothing here. The changed
  leaves are `materialized` before the check and the select read them, so that a step that is kept
  computes the same bits as without them.
  """
  after_leaves, treedef = jax.tree.flatten(after)
  before_leaves = treedef.flatten_up_to(before)
  # Which leaves belong to the train state or the method's state: the parts that are checked.
  checked_part = treedef.flatten_up_to(
    after.replace(
      train=jax.tree.map(lambda _: True, after.train),
      controller=jax.tree.map(lambda _: False, after.controller),
      method=jax.tree.map(lambda _: True, after.method),
      rng=False,
    )
  )
  changed = [i for i, (a, b) in enumerate(zip(after_leaves, before_leaves)) if a is not b]
  if not any(checked_part[i] and jnp.issubdtype(after_leaves[i].dtype, jnp.inexact) for i in changed):
    return after, info  # the step moved nothing that could be non-finite
  moved = dict(zip(changed, materialized([after_leaves[i] for i in changed], before.train.step < 0)))
  ok = all_finite([moved[i] for i in changed if checked_part[i]])
  kept = treedef.unflatten([jnp.where(ok, moved[i], b) if i in moved else b for i, b in enumerate(before_leaves)])
  step = jnp.where(ok, after.train.step, before.train.step + info.batch_consumed.astype(before.train.step.dtype))
  kept = kept.replace(train=kept.train.replace(step=step))
  bad = ~ok
  info = info.replace(
    discarded=bad,
    nonfinite_prediction=info.nonfinite_prediction | bad,
    diverged=info.diverged & ok,
    alpha=jnp.where(ok, info.alpha, 0.0),
  )
  return kept, info


def materialized(values: list[jax.Array], never: jax.Array) -> list[jax.Array]:
  """`values`, computed once into buffers of their own that later operations read.

  Without this, XLA fuses the operations that compute a value into each of its consumers (on CPU an
  `optimization_barrier` does not stop it): the check and the select of `keep_if_finite` would each
  compute the step's values again in fusions of their own, which round differently (an Adam update
  of the velocity predictor's corrector did), so a kept step would not be the step the method
  computed. A while loop is never fused with anything: `values` pass through one whose condition,
  `never`, is False at run time but not known to the compiler. Its body, which never runs, negates
  them: a body that returned `values` unchanged would let the compiler drop the loop, and one that
  returned other arrays would copy them into the loop's buffers (copies that never run, but count).
  """

  def flip(v):
    return jnp.logical_not(v) if v.dtype == jnp.bool_ else -v

  _, out = jax.lax.while_loop(
    lambda c: c[0], lambda c: (jnp.logical_and(c[0], False), [flip(v) for v in c[1]]), (never, values)
  )
  return out


StepFn = Callable[[HybridState, Batch, Schedule], tuple[HybridState, dict[str, jax.Array]]]


def init_hybrid_state(ctx: HybridContext, params: Any, rng: jax.Array) -> HybridState:
  """A fresh state around `params` (the optimizer is initialised here): the train state, the
  generic controller and the method's own state (`ctx.method.init(ctx, params, rng)`, given the
  state's key before the state keeps `split(rng, 3)[0]` of it)."""
  return HybridState(
    train=init_train_state(
      params, ctx.tx, ctx.averaging_beta, None if ctx.outer is None else init_outer_momentum(params, *ctx.outer)
    ),
    controller=state_lib.init_controller(),
    method=ctx.method.init(ctx, params, rng),
    rng=jax.random.split(rng, 3)[0],
  )


def finish_step(
  ctx: HybridContext, state: HybridState, info: StepInfo, phase_before: jax.Array, branch: jax.Array
) -> tuple[HybridState, dict[str, jax.Array]]:
  """Applies the controller transition, then the method's own (`method.on_transition`), and
  assembles the small dict of scalar measurements: the generic ones and the method's
  (`method.metrics`).

  `loss` is the measured loss (NaN in a predicted step that was not validated); `predicted_loss`
  is the plan's value for the step; `discarded` says the step was discarded (`discard_nonfinite`).
  """
  before = state.controller
  c = controller_lib.transition(before, info, ctx.control)
  method_state = state.method
  method_state = ctx.method.on_transition(ctx, method_state, before, c, info)
  state = state.replace(controller=c, method=method_state)
  metrics = {
    "loss": info.loss,
    "predicted_loss": info.predicted_loss,
    "phase": phase_before,
    "branch": jnp.asarray(branch, jnp.int32),  # the transition that ran (`Branch`): what the step cost
    "confidence": c.confidence,
    "grad_norm": info.grad_norm,
    "step": state.train.step,
    "horizon": c.horizon,
    "measured": info.was_real | info.validated,
    "diverged": info.diverged | info.nonfinite_prediction,
    "discarded": info.discarded,  # a predicted step the framework discarded (`discard_nonfinite`)
    "alpha": info.alpha,  # (G,) the per-group move this step applied (0 in real steps)
  }
  extra = ctx.method.metrics(ctx, state, info)
  clash = sorted(set(extra) & set(metrics))
  if clash:
    raise ValueError(f"method {ctx.method.name!r}: metrics() returns {clash}, names the hybrid step reports itself")
  metrics.update(extra)
  return state, metrics


def make_phase_step(ctx: HybridContext, branch: int) -> StepFn:
  """One transition plus the controller transition, as a pure function (for host dispatch)."""
  transition = transitions(ctx)[branch]

  def step(state: HybridState, batch: Batch, schedule: Schedule):
    phase = state.controller.phase
    new_state, info = transition(ctx, state, batch, schedule)
    return finish_step(ctx, new_state, info, phase, branch)

  return step


def hybrid_step(
  ctx: HybridContext, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, dict[str, jax.Array]]:
  """One hybrid step: the transition `Controller.next_branch` selects, then the controller transition.

  The selection is `switch_in_place`, not `lax.switch`: XLA gives a conditional's results buffers of
  their own, so a `lax.switch` branch copies every leaf it passes through unchanged (a predicted step
  copied the optimizer state, the velocity and the RSSM) and the results are copied back into the
  donated state afterwards, whichever branch ran. See `switch_in_place`. A method with one transition
  (no `predict_step` or `correct_step` of its own: it never predicts) has nothing to select, and runs
  it directly: it pays only for the controller's transition.
  """
  phase, branch = state.controller.phase, state.controller.next_branch
  fns = transitions(ctx)
  if all(f is fns[0] for f in fns):
    new_state, info = fns[0](ctx, state, batch, schedule)
  else:
    new_state, info = switch_in_place(ctx, branch, state, batch, schedule)
  return finish_step(ctx, new_state, info, phase, branch)


def switch_in_place(
  ctx: HybridContext, branch: jax.Array, state: HybridState, batch: Batch, schedule: Schedule
) -> tuple[HybridState, StepInfo]:
  """`lax.switch(branch, transitions(ctx), ...)` with the state updated in place.

  Each transition runs inside a `lax.while_loop` of one trip when selected and none otherwise. A
  while loop's input, body and output share one buffer per carried leaf, so the selected transition
  writes the donated state in place, exactly as its own jitted function does, with the same bits,
  and the ones not selected cost one predicate each. A transition two branches share (the real step,
  where a method defines no `correct_step`) is one loop that either selects; a `Prepared` transition
  runs its `prepare` in a loop of its own, then shares the loop of the transition it goes on to
  (`selection_loops`), so each transition is traced and compiled once.
  """
  fns = transitions(ctx)
  branch = jnp.clip(branch, 0, len(fns) - 1)  # as lax.switch clamps its index
  info = empty_step_info(ctx)
  prepares, bodies = selection_loops(fns)
  for branches, prepare in prepares:

    def prepare_once(carry, prepare=prepare):
      return jnp.asarray(False), prepare(ctx, carry[1], batch, schedule)

    _, state = jax.lax.while_loop(lambda carry: carry[0], prepare_once, (_selected(branch, branches), state))
  for branches, transition in bodies:

    def run_once(carry, transition=transition):
      _, s, _ = carry
      return (jnp.asarray(False), *transition(ctx, s, batch, schedule))

    _, state, info = jax.lax.while_loop(lambda carry: carry[0], run_once, (_selected(branch, branches), state, info))
  return state, info


def empty_step_info(ctx: HybridContext) -> StepInfo:
  """The StepInfo the fused step carries before a transition runs: every transition must return one
  of its structure, shapes and dtypes (`alpha` one entry per parameter group, `extra` the method's
  `step_extra`)."""
  return make_step_info(
    loss=0.0,
    predicted_loss=0.0,
    grad_norm=0.0,
    was_real=False,
    finite=False,
    explosion=False,
    spike=False,
    validated=False,
    diverged=False,
    nonfinite_prediction=False,
    alpha=jnp.zeros(ctx.groups.n_groups),
    forwards=0,
    batch_consumed=False,
    extra=ctx.method.step_extra(ctx),
  )


def selection_loops(
  fns: tuple[Transition, ...],
) -> tuple[list[tuple[tuple[int, ...], Callable]], list[tuple[tuple[int, ...], Transition]]]:
  """The loops `switch_in_place` runs, in order, each with the branches that select it: first the
  `prepare` of each `Prepared` transition (its own branch), then each distinct transition once (a
  `Prepared` one counted as the transition it goes on to), selected by every branch that runs it."""
  prepares, bodies = [], {}
  for index, fn in enumerate(fns):
    if isinstance(fn, Prepared):
      prepares.append(((index,), fn.prepare))
      fn = fn.then
    bodies.setdefault(id(fn), (fn, []))[1].append(index)
  return prepares, [(tuple(branches), fn) for fn, branches in bodies.values()]


def _selected(branch: jax.Array, branches: tuple[int, ...]) -> jax.Array:
  return functools.reduce(jnp.logical_or, [branch == b for b in branches])


def hybrid_multi_step(
  ctx: HybridContext, state: HybridState, batches: Batch, schedule: Schedule
) -> tuple[HybridState, dict[str, jax.Array]]:
  """K hybrid steps in one dispatch (`lax.scan`); every leaf of `batches` has a leading axis K,
  and every metric of the result too."""
  return jax.lax.scan(lambda s, b: hybrid_step(ctx, s, b, schedule), state, batches)
