"""The method contract's checks: a user's method's transitions traced on a run's abstract state and
first batch (`jax.eval_shape`: nothing is compiled or run), so that a wrong signature, return, state or
`StepInfo` is refused before anything is written, naming the hook and what it must be
(`hybridjax/methods/__init__.py` documents the contract; `loop.drivers.HybridDriver` calls
`check_hooks`). The built-in methods' hooks are the test suite's to check."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from hybridjax import registry
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.context import HybridContext, StepInfo
from hybridjax.hybrid.real_step import baseline_step
from hybridjax.hybrid.state import HybridState

Batch = Any


def check_hooks(ctx: HybridContext, state: HybridState, batch: Batch, schedule: Any) -> None:
  """Traces a user's method's transitions (`full_step`, `predict_step`, `correct_step`) on the
  abstract state and `batch` (`jax.eval_shape`: nothing is compiled or run), so that a wrong
  signature or return is refused before the workdir is made, naming the hook and what it must be.
  The built-in methods' hooks are the test suite's to check."""
  m = ctx.method
  if m.path in registry.BUILTIN_METHODS.values():
    return
  expected = "(ctx, state, batch, schedule) -> (state, StepInfo)"
  carried = jax.eval_shape(lambda: step_lib.empty_step_info(ctx))
  # A function of (ctx, state, batch, schedule) traced on the run's state and first batch.
  trace = lambda fn: jax.eval_shape(functools.partial(fn, ctx), state, batch, schedule)
  for name in ("full_step", "predict_step", "correct_step"):
    hook = getattr(m, name)
    if hook is None:
      continue
    where = f"method {m.name!r} ({m.path}): {name}"
    try:
      inspect.signature(hook).bind(ctx, state, batch, schedule)
    except TypeError as e:
      raise ValueError(f"{where}{inspect.signature(hook)} cannot be called as {name}{expected}: {e}") from e
    except ValueError:  # no signature to read (a builtin or C function): the trace below checks the call
      pass
    if isinstance(hook, step_lib.Prepared):  # its prepare alone first: the fused step runs it alone
      _check_prepare(trace, where, hook.prepare, state)
    try:
      out = trace(hook)
    except Exception as e:  # noqa: BLE001 (the user's code: any error it raises is its own)
      raise ValueError(
        f"{where} fails when traced on the run's state and first batch ({name}{expected}): {type(e).__name__}: {e}"
      ) from e
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], StepInfo)):
      got = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, tuple) else "")
      raise ValueError(
        f"{where} must return (state, StepInfo) as {name}{expected}; it returned {got} (build the "
        "StepInfo with StepInfo.real or StepInfo.predicted)"
      )
    if not _same_shapes(out[0], state):
      raise ValueError(
        f"{where} returns a state whose structure, shapes or dtypes differ from the state it received: "
        "a transition must return the HybridState it was given, updated (state.replace(...))"
      )
    wrong = _step_info_differences(out[1], carried)
    if wrong:
      raise ValueError(
        f"{where} returns a StepInfo whose {'; '.join(wrong)}: every transition returns the same StepInfo "
        f"structure, alpha with one entry per parameter group (ctx.groups.n_groups = {ctx.groups.n_groups}) "
        "and extra as the method's step_extra(ctx) gives it (None without one). Build it with "
        "StepInfo.real(n_groups=ctx.groups.n_groups, ...) or StepInfo.predicted(alpha=...)"
      )
  # A method without a full_step has the baseline's real step as its own
  # (`real_step.baseline_step`, whose `extra` is None): the fused step carries one StepInfo through
  # every transition it selects between, so that step must return the method's `step_extra`.
  fns = step_lib.transitions(ctx)
  if m.full_step is None and carried.extra is not None and not all(f is fns[0] for f in fns):
    _, info = trace(baseline_step)
    wrong = _step_info_differences(info, carried)
    if wrong:
      raise ValueError(
        f"method {m.name!r} ({m.path}) defines step_extra but no full_step, so its real steps are the "
        f"baseline's (hybridjax.hybrid.real_step.baseline_step), whose StepInfo's {'; '.join(wrong)}: the "
        "fused step carries one StepInfo through every transition. Define full_step(ctx, state, batch, "
        "schedule): state, info = baseline_step(ctx, state, batch, schedule), then return "
        "state, info.replace(extra=...) with extra as step_extra(ctx) gives it"
      )


def _check_prepare(trace: Callable, where: str, prepare: Callable, state: HybridState) -> None:
  """Refuses a `Prepared` transition's `prepare` that fails or returns other than the state's shape
  (`trace`: a function traced on the run's `state` and first batch)."""
  expected = "prepare(ctx, state, batch, schedule) -> state"
  try:
    out = trace(prepare)
  except Exception as e:  # noqa: BLE001 (the user's code: any error it raises is its own)
    raise ValueError(
      f"{where}'s Prepared.prepare fails when traced on the run's state and first batch ({expected}): "
      f"{type(e).__name__}: {e}"
    ) from e
  if not _same_shapes(out, state):
    got = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, tuple) else "")
    raise ValueError(
      f"{where}'s Prepared.prepare must return the HybridState it was given, updated (state.replace(...)), "
      f"with every leaf's shape and dtype unchanged ({expected}); it returned {got} that differs: a "
      "prepare returns the state alone, no StepInfo"
    )


def _same_shapes(out: Any, reference: Any) -> bool:
  """Whether `out` has `reference`'s tree structure and every leaf's shape and dtype."""
  return jax.tree.structure(out) == jax.tree.structure(reference) and all(
    a.shape == b.shape and a.dtype == b.dtype for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(reference))
  )


def _carries(out: Any, initial: Any) -> bool:
  """Whether a `lax.while_loop` whose initial carry leaf is `initial` accepts `out` as the body's: the
  same shape and dtype, or `initial` weakly typed (a Python scalar, as a `step_extra` may give) and
  promoting to `out`'s dtype, as the loop promotes such an initial value."""
  if out.shape != initial.shape:
    return False
  if out.dtype == initial.dtype:
    return True
  if not getattr(initial, "weak_type", False):
    return False
  kind = {"i": 0, "u": 0, "f": 0.0, "c": 0j}.get(np.dtype(initial.dtype).kind)  # the Python scalar it was
  return kind is not None and jax.numpy.result_type(kind, out.dtype) == out.dtype


def _step_info_differences(out: StepInfo, expected: StepInfo) -> list[str]:
  """Each field of `out` (each leaf, in a tree such as `extra`) whose structure, shape or dtype the
  fused step, carrying `expected`, would not accept, described."""

  def describe(x: Any) -> str:
    return f"shape {tuple(x.shape)} {np.dtype(x.dtype).name}"

  def describe_tree(tree: Any) -> str:
    if tree is None:
      return "None"
    structure = jax.tree.structure(tree)
    return describe(tree) if jax.tree_util.treedef_is_leaf(structure) else f"the tree {structure}"

  wrong = []
  for f in dataclasses.fields(expected):
    a, b = getattr(out, f.name), getattr(expected, f.name)
    if jax.tree.structure(a) != jax.tree.structure(b):
      wrong.append(f"{f.name} is {describe_tree(a)} where the step's is {describe_tree(b)}")
      continue
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
      if not _carries(x, y):
        wrong.append(f"{f.name}{jax.tree_util.keystr(path)} is {describe(x)} where the step's is {describe(y)}")
  return wrong
