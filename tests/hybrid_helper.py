"""The hybrid test problem shared by the step-level test modules (test_velocity, test_controller,
test_corrector, test_memory): the small MLP regression problem, its optimizer and schedule, and
compiled, donating step functions per hybrid config.

Compiling the RSSM inside every step kind dominates these modules' run time, so a `Setup` (one
context and its jitted functions) is made once per config and process (`setup`), and the session's
persistent compilation cache (tests/conftest.py) lets another xdist worker load the same programs.

Every batch carries a `scale` that multiplies the loss: 1.0 normally, NaN, Inf or a large factor to
inject a fault at a chosen step without another compile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from conftest import STD, small_hybrid_config

from hybridjax import config as config_lib
from hybridjax import optim
from hybridjax.hybrid import step as step_lib
from hybridjax.hybrid.phases import Branch
from hybridjax.loop import drivers
from hybridjax.methods.velocity import predict as predict_lib
from hybridjax.models import mlp

# The run length the hybrid context is compiled for (`HybridContext.total_steps`, the progress
# feature): that of the `train` runs in tests/loop/test_drivers.py and tests/test_memory.py
# (`train_config`), so that they run these very programs (loaded from the compilation cache). The
# learning-rate schedule is a runtime argument: `SCHEDULE` spans the longest run here.
CTX_STEPS = 40
TOTAL_STEPS = 1200
MODEL = mlp.MLP(features=(16, 16), n_out=1)
X, Y = mlp.make_regression_problem(0, n_in=4)
_BASE_LOSS = mlp.make_loss_fn(MODEL)


def loss_fn(params, batch):
  loss, aux = _BASE_LOSS(params, batch)
  return loss * batch["scale"], aux


def batch(i: int, scale: float = 1.0) -> dict[str, np.ndarray]:
  b = mlp.regression_batch(X, Y, step=i, batch_size=32, seed=0)
  b["scale"] = np.float32(scale)
  return b


def host_params(seed: int = 0) -> Any:
  """The initial params as host arrays: each state gets fresh device buffers to donate."""
  return jax.device_get(MODEL.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4)))["params"])


OPTIM = config_lib.default_optim_config()
OPTIM.learning_rate, OPTIM.warmup_steps = 1e-2, 5
TX = optim.make_optimizer(OPTIM)
SCHEDULE = optim.make_schedule(OPTIM, TOTAL_STEPS)
# The module-wide hybrid config: STD (every phase within ~30 steps) with a short cooldown, so that a
# fault is followed by PREDICT again soon.
MAIN = {**STD, "health.cooldown_steps": 8}


# A context that predicts rarely (confidence threshold 0.8: a few one-step PREDICT phases in 150
# steps, each validated and followed by CORRECT) with the corrector off. test_controller checks the
# confidence gate on it and test_corrector that the disabled corrector is never touched: one
# context, compiled once, serves both.
GATED = {"confidence_threshold": 0.8, "velocity.corrector.enabled": False}


def train_config(dispatch: str = "switch", steps_per_call: int = 1):
  """A complete config for `loop.train.train` with `reliability_helper.mlp_task()` whose step
  programs are those of `setup()` (the same problem, optimizer, hybrid config and length)."""
  import reliability_helper as rh

  c = rh.mlp_config("hybrid", steps=CTX_STEPS, **{k: v for k, v in MAIN.items() if k not in STD})
  c.hybrid.update(dispatch=dispatch, steps_per_call=steps_per_call)
  return c


class Setup:
  """One hybrid context over the MLP problem with its jitted, donating step functions.

  phase_fns[b]   `make_phase_step(ctx, b)` for `Branch` b (host dispatch); compiled on first use
  fused          `hybrid_step` (the `lax.switch` step)
  multi          `hybrid_multi_step` (K steps per call, `lax.scan`)
  predict        the bare `predict_step` (no controller transition), not donating
  """

  def __init__(
    self, overrides: dict[str, Any], loss: Callable = loss_fn, params: Any = None, tx=TX, total_steps: int = CTX_STEPS
  ):
    self.params = host_params() if params is None else params
    self.ctx = drivers.make_context(
      small_hybrid_config(**overrides), loss_fn=loss, tx=tx, params_shape=self.params, total_steps=total_steps
    )
    ctx = self.ctx
    jit = functools.partial(jax.jit, donate_argnums=0, keep_unused=True)
    self.phase_fns = [jit(step_lib.make_phase_step(ctx, b)) for b in Branch]
    self.fused = jit(lambda s, b, sch: step_lib.hybrid_step(ctx, s, b, sch))
    self.multi = jit(lambda s, b, sch: step_lib.hybrid_multi_step(ctx, s, b, sch))
    self.predict = jax.jit(lambda s, b, sch: predict_lib.predict_step(ctx, s, b, sch))
    self._init = jax.jit(lambda p, r: step_lib.init_hybrid_state(ctx, p, r))

  def init_state(self, seed: int = 0):
    """A fresh state, committed to the device as `loop.train` commits it (the same programs)."""
    params = jax.tree.map(jnp.asarray, self.params)
    return jax.device_put(self._init(params, jax.random.PRNGKey(seed)), jax.devices()[0])

  def step(self, state, b, dispatch: str = "host"):
    """One step; returns (state, branch it ran (host dispatch) or None, metrics on the device)."""
    if dispatch == "host":
      branch = int(jax.device_get(state.controller.next_branch))
      state, m = self.phase_fns[branch](state, b, SCHEDULE)
      return state, branch, m
    state, m = self.fused(state, b, SCHEDULE)
    return state, None, m

  def run(self, n: int, *, dispatch: str = "host", state=None, start: int = 0, batch_fn: Callable[[int], Any] = batch):
    """n steps from batch `start`; returns (state, per-step host metrics)."""
    state = self.init_state() if state is None else state
    trace = []
    for i in range(start, start + n):
      state, _, m = self.step(state, batch_fn(i), dispatch)
      trace.append(m)
    return state, jax.device_get(trace)


@functools.cache
def _setup(key: tuple) -> Setup:
  return Setup(dict(key))


def setup(**overrides) -> Setup:
  """The `Setup` of `small_hybrid_config(**MAIN, **overrides)`, made once per process."""
  return _setup(tuple(sorted({**MAIN, **overrides}.items())))


def commit(tree):
  """`tree` committed to the device, as a step's outputs are: a state edited by hand (new leaves
  from `jnp`) then runs the same compiled programs instead of compiling them again."""
  return jax.device_put(tree, jax.devices()[0])
