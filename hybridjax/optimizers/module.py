"""An optimizer of the user's as a module, named by its dotted path in `optim.name` (a benchmark side:
`--config.benchmark.optimizers.sides=adamw,my_pkg.cautious`). The module defines

* `optimizer(learning_rate, labels=..., **knobs)`: an optax factory. The config's schedule drives its
  `learning_rate` (injected); `labels`, where it takes one, is `group_labels`, a function params ->
  labels in the `optax.partition` style ('hidden', 'embed', 'head', 'vector'), so a matrix optimizer
  applies where it should;
* `CONFIG = {knob: default}`: its knobs, the factory's keyword arguments. A run holds them in the block
  `optim.<BLOCK>` of its config, so they are in its spec and cache key, beside the module's code
  (`bench.runs.keys.spec_modules`);
* `SPACE`: its search space in AlgoPerf's `tuning_search_space` shape, `{knob: {"min", "max", "scaling":
  "log" | "linear"}}` or `{knob: {"feasible_points": [...]}}`, `learning_rate` among its knobs;
* optionally `OWNS_SCHEDULE = True` (it anneals on its own: the config's schedule holds the rate after its
  warm-up, `optim.min_lr_ratio` 1.0, and need not reach its updates), `eval_params =
  optax.contrib.schedule_free_eval_params` (the one evaluation point the trainer knows how to find in an
  optimizer state: `optimizers.eval_params`), and `EXTRA_PASSES = 0` (extra gradient or Hessian
  evaluations per step; the comparison charges none, so any other count is refused).

`errors` refuses, before anything trains, a module that breaks this, each line naming the fix."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from hybridjax.optimizers.labels import muon_group_labels
from hybridjax.optimizers.user import check_user_optimizer

BLOCK = "module"  # the block of `config.optim` that holds a module's knobs


def group_labels(params: Any) -> Any:
  """'hidden' (a hidden matrix), 'embed' (an embedding table; a head tied to it too), 'head' (an untied
  output head) or 'vector' (every leaf with ndim != 2) for each leaf of `params`: `muon_group_labels`'
  groups under names that say what they hold."""
  names = {"muon": "hidden", "muon_qkv": "hidden", "embed": "embed", "head": "head", "scalar": "vector"}
  return jax.tree.map(names.get, muon_group_labels(params, tied_label="embed"))


@dataclasses.dataclass(frozen=True)
class OptimizerModule:
  """A user's optimizer module, read once (`load`)."""

  path: str
  factory: Callable[..., optax.GradientTransformation] | None
  defaults: dict[str, Any]
  space: Any
  owns_schedule: bool
  eval_params: Any
  extra_passes: Any

  def takes(self) -> set[str] | None:
    """The keyword arguments its factory takes (None: any, it takes **kwargs)."""
    params = inspect.signature(self.factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
      return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


@functools.cache
def load(path: str) -> OptimizerModule:
  """The optimizer module at dotted `path`; a ValueError names `optim.name` and the fix."""
  try:
    m = importlib.import_module(path)
  except ModuleNotFoundError as e:
    raise ValueError(
      f"--config.optim.name={path!r} names no built-in optimizer and no importable module: give a built-in "
      "name or the dotted path of a module of yours (its folder on sys.path)"
    ) from e
  return OptimizerModule(
    path,
    getattr(m, "optimizer", None),
    dict(getattr(m, "CONFIG", {})),
    getattr(m, "SPACE", None),
    bool(getattr(m, "OWNS_SCHEDULE", False)),
    getattr(m, "eval_params", None),
    getattr(m, "EXTRA_PASSES", 0),
  )


def _space_errors(m: OptimizerModule, head: str) -> list[str]:
  shape = '{knob: {"min": ..., "max": ..., "scaling": "log"|"linear"}} or {knob: {"feasible_points": [...]}}'
  if not isinstance(m.space, dict) or not m.space:
    return [f"{head}: its SPACE names no knob; declare SPACE = {shape}, learning_rate among its knobs"]
  errors, takes = [], m.takes()
  for knob, spec in m.space.items():
    where = f"{head}: SPACE[{knob!r}]"
    if knob != "learning_rate" and takes is not None and knob not in takes:
      errors.append(
        f"{where} is a knob its optimizer() does not take (it takes {sorted(takes)}): name one of them, or add "
        f"{knob} to optimizer()'s parameters and to CONFIG"
      )
    elif knob != "learning_rate" and knob not in m.defaults:
      errors.append(f"{where} has no default in CONFIG: add {knob!r}: <its value> to CONFIG")
    if not isinstance(spec, dict):
      errors.append(f"{where} is {spec!r}, not a dict: give it as {shape}")
    elif "feasible_points" in spec:
      if not list(spec["feasible_points"]):
        errors.append(f"{where}['feasible_points'] is empty: list at least one value")
    elif set(spec) != {"min", "max", "scaling"} or spec["scaling"] not in ("log", "linear"):
      errors.append(f"{where} is {spec!r}: give min, max and scaling ('log' or 'linear'), or feasible_points")
    elif not spec["min"] < spec["max"] or (spec["scaling"] == "log" and spec["min"] <= 0):
      errors.append(f"{where}: min {spec['min']} must be below max {spec['max']} (and above 0 on a log scale)")
  if "learning_rate" not in m.space:
    errors.append(f"{head}: its SPACE has no learning_rate: add one, the LR is searched on every side")
  return errors


def errors(path: str) -> list[str]:
  """What keeps the module at `path` from being a benchmark side, each line naming the fix; nothing is
  built or trained."""
  m, head = load(path), f"--config.optim.name={path!r}"
  if not callable(m.factory):
    return [f"{head} defines no optimizer(learning_rate, ...): define that factory, returning an optax transformation"]
  out = _space_errors(m, head)
  takes = m.takes()
  out += [
    f"{head}: CONFIG[{k!r}] is a knob its optimizer() does not take: remove it, or add it to optimizer()'s parameters"
    for k in m.defaults
    if takes is not None and k not in takes
  ]
  if m.eval_params not in (None, optax.contrib.schedule_free_eval_params):
    out.append(
      f"{head} defines eval_params, which the trainer cannot call (it finds the evaluation point in the optimizer "
      "state: optimizers.eval_params): set eval_params = optax.contrib.schedule_free_eval_params with an optimizer "
      "built on optax.contrib.schedule_free, or remove it"
    )
  if m.extra_passes != 0:
    out.append(
      f"{head}: EXTRA_PASSES = {m.extra_passes!r} gradient or Hessian evaluations a step, which this comparison "
      "does not charge (every side is read per step): set EXTRA_PASSES = 0, or leave it out"
    )
  return out


def schedule_errors(optim: ml_collections.ConfigDict, tx: optax.GradientTransformation, params: Any) -> list[str]:
  """The lines of `optimizers.user.check_user_optimizer` for the module `optim.name`'s `tx` (resolved:
  `optimizers.resolve_optimizer`) on `params` (shapes), unless it owns its schedule; that fix then named.
  Only traced."""
  m = load(str(optim.name))
  if not m.owns_schedule:
    try:
      check_user_optimizer(tx, params, optim)
    except ValueError as e:
      return [f"{e}; or, if it anneals on its own, declare OWNS_SCHEDULE = True in {m.path}"]
  return []


def with_block(config: ml_collections.ConfigDict, m: OptimizerModule) -> ml_collections.ConfigDict:
  """`config` with the module's knobs at their defaults in `optim.<BLOCK>`."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.optim[BLOCK] = dict(m.defaults)
  return c


def factory(optim: ml_collections.ConfigDict) -> Callable[..., optax.GradientTransformation]:
  """The module `optim.name`'s factory `learning_rate -> transformation` at the knobs of `optim.<BLOCK>`."""
  m = load(str(optim.name))
  knobs = dict(optim[BLOCK])
  if "labels" in (m.takes() or ()):
    knobs["labels"] = group_labels
  return lambda learning_rate: m.factory(learning_rate=learning_rate, **knobs)
