"""An optimizer of the user's (`train(tx=...)`): what the schedule needs of it, and the check that it
gets it.

The config's schedule drives every run's learning rate by writing the injected `learning_rate` of
each `optax.inject_hyperparams` state (`with_learning_rate`); a user's transformation must have one,
and `user_optimizer_errors` traces its update (computing nothing) to refuse one the schedule would
not drive: a schedule-valued injected rate, updates that ignore it, differing rates (per-group
ratios), or one nested inside another. This module imports nothing of the package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax

Optimizer = optax.GradientTransformation | Callable[..., optax.GradientTransformation]
"""A user's optimizer: an optax transformation whose learning rate is injected
(`optax.inject_hyperparams`), or a factory `learning_rate -> transformation`."""


def injected_learning_rates(tx: optax.GradientTransformation, params: Any) -> int:
  """How many `inject_hyperparams` states of `tx.init(params)` hold a `learning_rate`: the
  entries `with_learning_rate` sets (0: the schedule cannot drive `tx`). Nothing is allocated."""
  state = jax.eval_shape(tx.init, params)
  nodes = jax.tree.leaves(state, is_leaf=_is_inject_state)
  return sum(1 for n in nodes if _is_inject_state(n) and "learning_rate" in n.hyperparams)


def _factory_with_learning_rate(factory: Callable[..., optax.GradientTransformation]) -> Callable:
  """`factory` callable as `factory(learning_rate=...)`, as `inject_hyperparams` calls it: a factory
  whose one parameter has another name (`lambda lr: ...`) is wrapped."""
  try:
    params = inspect.signature(factory).parameters
  except (TypeError, ValueError):  # a builtin or C callable: call it by keyword and let it fail clearly
    return factory
  if "learning_rate" in params:
    return factory
  positional = [
    p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
  ]
  if len(positional) != 1:
    raise ValueError(
      f"train(tx=...) got a factory {getattr(factory, '__name__', factory)!r} with parameters "
      f"{list(params)}: a factory must take the learning rate, as its only required parameter or as "
      "`learning_rate` (e.g. `lambda learning_rate: optax.adamw(learning_rate)`)"
    )

  def with_learning_rate_kwarg(learning_rate):
    return factory(learning_rate)

  return with_learning_rate_kwarg


def _is_inject_state(node: Any) -> bool:
  return isinstance(node, (optax.InjectStatefulHyperparamsState, optax.InjectHyperparamsState))


def with_learning_rate(opt_state: Any, lr: jax.Array) -> Any:
  """`opt_state` with the injected `learning_rate` of every `inject_hyperparams` state set to `lr`."""

  def put(node):
    if _is_inject_state(node) and "learning_rate" in node.hyperparams:
      old = node.hyperparams["learning_rate"]
      return node._replace(hyperparams={**node.hyperparams, "learning_rate": jnp.asarray(lr, old.dtype)})
    return node

  return jax.tree.map(put, opt_state, is_leaf=_is_inject_state)


_FACTORY_FIX = (
  "Pass a factory learning_rate -> transformation instead, with any per-group ratios inside it: "
  "tx=lambda lr: optax.multi_transform({'a': optax.adam(lr), 'b': optax.adam(lr * 0.1)}, labels) "
  "(a frozen group: optax.set_to_zero())"
)


def _injected_learning_rates(state: Any) -> tuple[list[tuple[str, Any]], list[str]]:
  """The `inject_hyperparams` states of `state` holding a `learning_rate`: (path, node) of the
  outermost ones, which `optim.with_learning_rate` writes, and the paths of those nested inside one
  (a factory that returns an injected transformation), which it never writes."""
  outer, nested = [], []

  def walk(tree: Any, prefix: str, inside: bool) -> None:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_inject_state)
    for path, node in flat:
      if not _is_inject_state(node):
        continue
      where = prefix + jax.tree_util.keystr(path)
      has_lr = "learning_rate" in node.hyperparams
      if has_lr:
        (nested.append(where) if inside else outer.append((where, node)))
      walk(node.inner_state, where + ".inner_state", inside or has_lr)

  walk(state, "state", False)
  return outer, nested


def _learning_rate_reaches_updates(tx: Any, params: Any) -> bool:
  """Whether the learning rate `optim.with_learning_rate` writes into `tx`'s state reaches the
  updates of `tx.update`, as the train step calls it: a backward walk over the traced update's
  equations from its updates (an equation with a needed output needs all its inputs, sub-programs
  included), so it may say yes for a learning rate that has no effect, never no for one that has.
  Only traced (`jax.make_jaxpr` on the shapes): nothing is computed."""
  state = jax.eval_shape(tx.init, params)

  def updates(lr, grads, state, params):
    return tx.update(grads, with_learning_rate(state, lr), params)[0]

  jaxpr = jax.make_jaxpr(updates)(jax.ShapeDtypeStruct((), jnp.float32), params, state, params).jaxpr
  needed = {v for v in jaxpr.outvars if not isinstance(v, jax.extend.core.Literal)}
  for eqn in reversed(jaxpr.eqns):
    if any(v in needed for v in eqn.outvars if not isinstance(v, jax.extend.core.DropVar)):
      needed.update(v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal))
  return jaxpr.invars[0] in needed


def user_optimizer_errors(tx: Any, params: Any, optim: Any) -> list[str]:
  """What would keep the config's schedule from driving a user's optimizer (`train(tx=...)`,
  resolved: `optim.resolve_optimizer`), each a line naming the fix; empty when it drives it.

  `optim.with_learning_rate` writes the scheduled learning rate into every injected `learning_rate`
  before each update. That is silently defeated by
  * a schedule-valued injected learning rate (`inject_hyperparams(optax.adam)(learning_rate=
    optax.constant_schedule(0.0))`): optax recomputes it from its own count at every update;
  * a transformation whose updates do not read the injected learning rate (a factory that ignores
    its argument, `lambda learning_rate: optax.adam(1e-3)`);
  * injected learning rates that differ (per-group rates in a `multi_transform`): every one is
    overwritten with the same rate, and the ratios are lost; and an injected learning rate inside
    another's (a factory that returns an injected transformation), which it never writes: it keeps
    its initial value.

  `params`: the params or their `jax.ShapeDtypeStruct`s. Only traced: nothing is computed.
  """
  sched = (
    f"the config's schedule (--config.optim.schedule={optim.get('schedule', 'cosine')!r}, peak "
    f"--config.optim.learning_rate={optim.learning_rate})"
  )
  head = f"the optimizer {optim.name!r} given to train(tx=...)"
  state = jax.eval_shape(tx.init, params)
  injected, nested = _injected_learning_rates(state)
  errors = []
  scheduled = [where for where, node in injected if "learning_rate" in getattr(node, "hyperparams_states", {})]
  if scheduled:
    errors.append(
      f"{head} has a schedule as its injected learning rate ({', '.join(scheduled)}: "
      "optax.inject_hyperparams(...)(learning_rate=<a schedule>)). optax recomputes it from its own step count at "
      f"every update, overwriting the rate {sched} writes, so the run would record one schedule and train on "
      "another. Give a number, the config's schedule drives it: optax.inject_hyperparams(optax.adam)"
      "(learning_rate=0.0), or a factory tx=lambda lr: optax.adam(lr)"
    )
  if nested:
    errors.append(
      f"{head} holds an injected learning rate inside another ({', '.join(nested)}): a factory that returns an "
      f"optax.inject_hyperparams(...) transformation. {sched.capitalize()} is written into the outer one only "
      "(optim.with_learning_rate), so the inner one silently keeps its initial value whatever the factory "
      "computes from its argument. Return a plain transformation from the factory: tx=lambda lr: optax.adam(lr), "
      "with any per-group ratios inside it (optax.multi_transform({'a': optax.adam(lr), 'b': optax.adam(lr * 0.1)}, "
      "labels))"
    )
  if len(injected) > 1:
    initial = dict(injected_learning_rate_values(tx, params))
    values = [initial.get(f"{where}.hyperparams['learning_rate']") for where, _ in injected]
    if None in values or len(set(values)) > 1:
      shown = ", ".join(
        f"{where}={'<not a constant>' if v is None else f'{v:g}'}"
        for (where, _), v in zip(injected, values, strict=True)
      )
      errors.append(
        f"{head} has {len(injected)} injected learning rates that differ ({shown}). {sched.capitalize()} writes "
        "the same learning rate into every one of them (optim.with_learning_rate), so their ratios (a group "
        f"frozen at 0, a slower group) would be silently lost. {_FACTORY_FIX}"
      )
  if not scheduled and not nested and not _learning_rate_reaches_updates(tx, params):
    errors.append(
      f"{head} does not use the learning rate {sched} writes into it (optim.with_learning_rate): its updates do "
      "not depend on it, e.g. a factory that ignores its argument (tx=lambda learning_rate: optax.adam(1e-3)). "
      "The run would record the schedule and train on a rate of its own. Build the optimizer from the factory's "
      "argument: tx=lambda learning_rate: optax.adam(learning_rate)"
    )
  return errors


def injected_learning_rate_values(tx: optax.GradientTransformation, params: Any) -> list[tuple[str, float | None]]:
  """(where, initial value) of each injected `learning_rate` of `tx.init(params)`, the value None where it
  is not a constant (a schedule's). Read from the traced `tx.init` (a constant hyperparameter is a literal
  or a constant of its jaxpr): nothing is computed or allocated."""
  closed, shape = jax.make_jaxpr(tx.init, return_shape=True)(params)
  leaves = jax.tree_util.tree_flatten_with_path(shape)[0]
  if len(leaves) != len(closed.jaxpr.outvars):
    return []
  consts = dict(zip(closed.jaxpr.constvars, closed.consts))
  found = []
  for (path, _), var in zip(leaves, closed.jaxpr.outvars):
    names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
    if names[-2:] != ["hyperparams", "learning_rate"]:
      continue
    value = None
    if isinstance(var, jax.extend.core.Literal):
      value = float(var.val)
    elif var in consts and np.ndim(consts[var]) == 0:
      value = float(consts[var])
    found.append(("state" + jax.tree_util.keystr(path), value))
  return found


def overwritten_learning_rate_errors(tx: optax.GradientTransformation, params: Any, optim: Any) -> list[str]:
  """The injected learning rates of a user's `tx` (resolved: `resolve_optimizer`) that the config's
  schedule would silently write over: `with_learning_rate` sets every injected `learning_rate` to the
  schedule's value before each update, so a number written there (`inject_hyperparams(optax.adamw)(
  learning_rate=1e-4)`) is never trained at. Accepted: the schedule's peak `optim.learning_rate`, and
  0.0, which states no rate (the form a factory is wrapped in). A line per rate refused, naming both
  values and the fix."""
  peak = float(optim.learning_rate)
  return [
    f"the optimizer {optim.name!r} given to train(tx=...) injects learning_rate={value:g} ({where}), but the "
    f"config's schedule (--config.optim.schedule={optim.get('schedule', 'cosine')!r}, peak "
    f"--config.optim.learning_rate={optim.learning_rate}) writes its own rate over it before every update: the run "
    f"would train at the schedule's rate, never at {value:g}. To train at {value:g}, set "
    f"--config.optim.learning_rate={value:g} (and inject that value, or 0.0); or pass a factory, "
    "tx=lambda learning_rate: optax.adamw(learning_rate)"
    for where, value in injected_learning_rate_values(tx, params)
    # 0.0 states no rate; the peak is accepted up to float32 rounding
    if not (value is None or value == 0.0 or np.isclose(value, peak, rtol=1e-6, atol=0.0))
  ]


def check_user_optimizer(tx: Any, params: Any, optim: Any) -> None:
  """Refuses a user's optimizer that the config's schedule cannot drive (`user_optimizer_errors`)."""
  errors = user_optimizer_errors(tx, params, optim) + overwritten_learning_rate_errors(tx, params, optim)
  if errors:
    raise ValueError("\n  ".join(errors))


# --- resuming with another trainer.steps -----------------------------------------------------------
