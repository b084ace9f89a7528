"""The fused step's selection (`hybrid.step.switch_in_place`): `lax.switch`'s results, with each
transition traced once, also when two branches share it or one prepares the state for another."""

from __future__ import annotations

import types

import chex
import jax
import jax.numpy as jnp
import pytest

from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.context import StepInfo


def _info(loss):
  return StepInfo.real(loss=loss, grad_norm=0.0, finite=True, explosion=False, spike=False, n_groups=1)


def _method(traces, correct_prepared):
  """A method on a state of one float: the real step adds the batch, the predicted step doubles the
  state, the CORRECT entry negates it and then takes the real step. `traces` counts each trace."""

  def full_step(ctx, state, batch, schedule):
    traces["full_step"] += 1
    new = state + batch
    return new, _info(new)

  def predict_step(ctx, state, batch, schedule):
    traces["predict_step"] += 1
    return 2.0 * state, _info(-1.0)

  def negate(ctx, state, batch, schedule):
    traces["negate"] += 1
    return -state

  correct = (
    step_lib.Prepared(negate, full_step)
    if correct_prepared
    else lambda ctx, s, b, k: full_step(ctx, negate(ctx, s, b, k), b, k)
  )
  return full_step, predict_step, correct


def _ctx(monkeypatch, fns):
  """A context whose method has the transitions `fns` (`transitions(ctx)`: the framework's wrapping
  of a predicted step needs a `HybridState`, which these do not keep)."""
  monkeypatch.setattr(step_lib, "transitions", lambda ctx: fns)
  method = types.SimpleNamespace(step_extra=lambda ctx: None)
  return types.SimpleNamespace(method=method, groups=types.SimpleNamespace(n_groups=1))


def _switch(ctx, fns):
  def step(branch, state, batch):
    return step_lib.switch_in_place(ctx, branch, state, batch, None)

  def reference(branch, state, batch):
    return jax.lax.switch(branch, [lambda s, b, f=f: f(ctx, s, b, None) for f in fns], state, batch)

  return step, reference


@pytest.mark.parametrize("correct_prepared", [True, False])
def test_each_branch_gives_lax_switchs_result(monkeypatch, correct_prepared):
  fns = _method({"full_step": 0, "predict_step": 0, "negate": 0}, correct_prepared)
  step, reference = _switch(_ctx(monkeypatch, fns), fns)
  state, batch = jnp.float32(3.0), jnp.float32(0.5)
  for branch, expected in ((0, 3.5), (1, 6.0), (2, -2.5), (7, -2.5), (-1, 3.5)):  # clamped as lax.switch
    got = jax.jit(step)(branch, state, batch)
    chex.assert_trees_all_equal(got, jax.jit(reference)(branch, state, batch))
    assert float(got[0]) == expected, branch


def test_a_prepared_transition_shares_the_real_steps_trace(monkeypatch):
  traces = {"full_step": 0, "predict_step": 0, "negate": 0}
  ctx = _ctx(monkeypatch, _method(traces, correct_prepared=True))
  jax.make_jaxpr(lambda b, s, x: step_lib.switch_in_place(ctx, b, s, x, None))(0, jnp.float32(1), jnp.float32(1))
  assert traces == {"full_step": 1, "predict_step": 1, "negate": 1}
  # Written as one function, the CORRECT entry traces the real step a second time: the test can fail.
  traces.update(full_step=0, predict_step=0, negate=0)
  ctx = _ctx(monkeypatch, _method(traces, correct_prepared=False))
  jax.make_jaxpr(lambda b, s, x: step_lib.switch_in_place(ctx, b, s, x, None))(0, jnp.float32(1), jnp.float32(1))
  assert traces == {"full_step": 2, "predict_step": 1, "negate": 1}


def test_a_transition_two_branches_share_is_one_loop_either_selects():
  full = object()
  prepared = step_lib.Prepared(prepare=len, then=full)
  prepares, bodies = step_lib.selection_loops((full, len, full))
  assert prepares == [] and bodies == [((0, 2), full), ((1,), len)]
  prepares, bodies = step_lib.selection_loops((full, len, prepared))
  assert prepares == [((2,), len)] and bodies == [((0, 2), full), ((1,), len)]


def test_the_velocity_predictors_correct_entry_goes_on_to_its_own_real_step():
  from hybridjax.methods import velocity

  assert isinstance(velocity.correct_step, step_lib.Prepared)
  assert velocity.correct_step.then is velocity.full_step
