"""A user's optimizer module (`optimizers.module`): its checks, each naming the fix, before anything is
built or trained; its parameter groups; its knobs in its runs' configs and its code in their keys."""

from __future__ import annotations

import itertools
import textwrap

import jax
import jax.numpy as jnp
import pytest

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import optim
from hybridjax.bench import search, specs
from hybridjax.bench.runs import keys
from hybridjax.optimizers import module

GOOD = """
import optax
CONFIG = {"b1": 0.9, "weight_decay": 0.1}
SPACE = {"learning_rate": {"min": 1e-3, "max": 1e-2, "scaling": "log"}, "b1": {"feasible_points": [0.9, 0.95]}}
def optimizer(learning_rate, b1, weight_decay):
  return optax.adamw(learning_rate, b1=b1, weight_decay=weight_decay)
"""
_names = itertools.count()


def _module(tmp_path, monkeypatch, source: str) -> str:
  name = f"user_opt_{next(_names)}"
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
  monkeypatch.syspath_prepend(str(tmp_path))
  return name


@pytest.mark.parametrize(
  "change, message",
  [
    ("SPACE = {}", r"its SPACE names no knob; declare SPACE = \{knob: "),
    (
      "SPACE = {'learning_rate': {'min': 1e-3, 'max': 1e-2, 'scaling': 'log'}, 'b3': {'feasible_points': [1]}}",
      r"SPACE\['b3'\] is a knob its optimizer\(\) does not take \(it takes .*\): name one of them",
    ),
    (
      "SPACE = {'learning_rate': {'min': 1e-3, 'max': 1e-2, 'scaling': 'cubic'}}",
      r"SPACE\['learning_rate'\] is .*: give min, max and scaling \('log' or 'linear'\), or feasible_points",
    ),
    ("SPACE = {'learning_rate': {'min': 0.0, 'max': 1e-2, 'scaling': 'log'}}", r"above 0 on a log scale"),
    ("SPACE = {'b1': {'feasible_points': [0.9]}}", r"its SPACE has no learning_rate: add one"),
    ("CONFIG = {'b1': 0.9, 'weight_decay': 0.1, 'b2': 0.99}", r"CONFIG\['b2'\] is a knob its optimizer\(\) does not"),
    ("eval_params = lambda state, params: params", r"defines eval_params, which the trainer cannot call"),
    ("EXTRA_PASSES = 1", r"EXTRA_PASSES = 1 gradient or Hessian evaluations a step.*: set EXTRA_PASSES = 0"),
    ("optimizer = None", r"defines no optimizer\(learning_rate, \.\.\.\): define that factory"),
  ],
)
def test_a_broken_module_is_refused_naming_the_fix(tmp_path, monkeypatch, change, message):
  name = _module(tmp_path, monkeypatch, GOOD)
  assert module.errors(name) == []
  broken = _module(tmp_path, monkeypatch, GOOD + change + "\n")
  assert any(__import__("re").search(message, e) for e in module.errors(broken)), module.errors(broken)


def _resolved(name: str):
  c = search.centred(benchmark_cfg.get_config("quick"), name)
  params = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32), "b": jax.ShapeDtypeStruct((4,), jnp.float32)}
  return c, module.schedule_errors(c.optim, optim.resolve_optimizer(c.optim, params), params)


def test_a_factory_the_schedule_cannot_drive_is_refused_unless_it_owns_its_schedule(tmp_path, monkeypatch):
  """A factory that ignores its learning rate: refused, the fix naming OWNS_SCHEDULE; declared, accepted
  (and its side holds the schedule's rate after the warm-up, and searches no schedule)."""
  ignores = GOOD.replace("optax.adamw(learning_rate,", "optax.adamw(1e-3,")
  assert _resolved(_module(tmp_path, monkeypatch, GOOD))[1] == []
  c, errors = _resolved(_module(tmp_path, monkeypatch, ignores))
  assert errors and "does not use the learning rate" in errors[0] and "declare OWNS_SCHEDULE = True" in errors[0]
  c, errors = _resolved(_module(tmp_path, monkeypatch, ignores + "OWNS_SCHEDULE = True\n"))
  assert errors == [] and c.optim.min_lr_ratio == 1.0
  assert not {"optim.schedule", "optim.min_lr_ratio"} & {k.field for k in search.space_of(c, 4)}


def test_the_factory_gets_the_parameter_groups_partition_style():
  """`labels` maps params to 'hidden', 'embed', 'head' or 'vector' (a head tied to the embedding: 'embed')."""
  params = {
    "wte": {"embedding": jnp.zeros((8, 4))},
    "h_0": {"attn": {"c_attn": {"kernel": jnp.zeros((4, 12)), "bias": jnp.zeros(12)}}},
    "lm_head": {"kernel": jnp.zeros((4, 8))},
  }
  labels = module.group_labels(params)
  assert labels["wte"]["embedding"] == "embed" and labels["lm_head"]["kernel"] == "head"
  assert labels["h_0"]["attn"]["c_attn"] == {"kernel": "hidden", "bias": "vector"}
  del params["lm_head"]
  assert module.group_labels(params)["wte"]["embedding"] == "embed"


def test_a_modules_knobs_are_in_its_runs_spec_and_its_code_in_their_key(tmp_path, monkeypatch):
  """Its block is in the spec (another knob, another run) and its module among the key's code: an edited
  optimizer never reads a stale cached run."""
  name = _module(tmp_path, monkeypatch, GOOD)
  c = search.centred(benchmark_cfg.get_config("quick"), name)
  spec = specs.run_spec(c, kind="anchor", seed=1, lr=1e-3, steps=10, beta=0.9)
  assert spec["config"]["optim"]["module"] == {"b1": 0.9, "weight_decay": c.optim.module.weight_decay}
  assert name in keys.spec_modules(spec)
  before = keys.run_key(spec)
  other = specs.run_spec(
    search.apply_setting(c, {"optim.module.b1": 0.95}), kind="anchor", seed=1, lr=1e-3, steps=10, beta=0.9
  )
  assert keys.run_key(other) != before
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(GOOD) + "X = 1\n")
  assert keys.run_key(spec) != before
