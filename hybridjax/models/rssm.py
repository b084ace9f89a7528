"""The trajectory model: an ensemble of small recurrent state-space models (RSSM).

The trainer records one normalised feature vector per real training step in a ring buffer. This
module learns, online and inside the jitted training step, to predict from a window of that buffer

* the next change of the log-loss, ``d_t = logloss[t+1] - logloss[t]``, and
* the per-parameter-group scale ``alpha_{g,t}`` that best explains the next real update as
  ``alpha_g * velocity_g``,

and it imagines both ``horizon`` steps ahead for the PREDICT phase.

Architecture (DreamerV3 style, one ensemble member); o_t = [x_t, u_t] is the observation of step t::

    h_t  = GRU(h_{t-1}, [z_{t-1}, o_{t-1}])            deterministic path (fused LayerNorm GRU)
    p(z_t | h_t)                                        prior, used in imagination
    q(z_t | h_t, o_t)                                   posterior, used when o_t is observed
    s_t  = [h_t, z_t]  ->  d_t / dloss_scale, alpha_t, x_hat_t   heads (one shared hidden layer)

u_t = symlog(d_{t-1} / dloss_scale) is the observed log-loss change into step t: the model sees its
own target series in fixed units next to the drifting normalised features (see ``_clean_window``).

The latent ``z`` is a **continuous diagonal Gaussian** (``mean``, ``std = softplus + min_std``), not
DreamerV3's 32x32 categorical: the signal here is a handful of smooth scalars, a Gaussian KL is
analytic and cheap, and the ensemble (not the latent) carries the epistemic uncertainty.

In imagination o is not observed: the decoder's ``x_hat`` replaces x and the model's own predicted
change replaces u. By default imagination is deterministic (posterior and prior *means*, see
``RSSMConfig.imagine_sample``).

``E`` members share the data but differ in init and in posterior-sampling noise. Their parameters
are stacked on a leading axis and every public function maps over it with ``jax.vmap``; each member
also has its own optimizer state (the optimizer update is vmapped too), so gradient clipping and
Adam's statistics never couple the members and their disagreement stays an honest uncertainty
signal.

Everything here is pure and has static shapes, so it can sit inside ``jax.jit``, ``lax.scan``,
``lax.cond`` and ``lax.switch``.

Windows
-------
A *window* is a mapping (``dict``) or any object with these attributes, in chronological order:

* ``x``            (W, F) float32 -- normalised feature vectors of steps 0..W-1;
* ``logloss``      (W,)   float32 -- raw log-loss of each step;
* ``alpha_target`` (W, G) float32 -- least-squares scale of the update that follows step t;
* ``valid``        (W,)   bool    -- False for entries not yet filled (always a prefix).

Targets at position t exist iff ``valid[t] & valid[t+1]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class RSSMConfig:
  """Hyper-parameters of the trajectory model (frozen, hence hashable: a valid static jit arg).

  Attributes:
    feature_dim: F, length of a feature vector.
    n_groups: G, number of parameter groups (one alpha per group).
    deter: size of the GRU state h.
    latent: size of the Gaussian latent z.
    hidden: width of every MLP.
    ensemble: E, number of independently initialised members.
    free_bits: KL free bits in nats (per step, on the KL summed over latent dims), as DreamerV3.
    kl_dyn_scale: weight of KL(sg(q) || p), which trains the prior towards the posterior.
    kl_rep_scale: weight of KL(q || sg(p)), which regularises the posterior towards the prior.
    learning_rate: Adam learning rate.
    alpha_max: predicted alphas lie in [-alpha_max, alpha_max] (a tanh squash).
    dloss_scale: the log-loss change is predicted in units of ``dloss_scale`` (a fixed 0.01) so
      that its MSE is O(1): typical per-step changes are 1e-3..1e-1 in log space, and with ~1%
      minibatch noise the target is drift +- 1.4 (std) in these units. A fixed scale keeps the
      model stateless (a running target normaliser would move the head's meaning under it);
      early-training changes far above the scale are tamed by per-member gradient clipping.
    min_std: lower bound of the latent standard deviations (keeps the KL well conditioned).
    grad_clip: per-member global-norm gradient clipping before Adam.
    head_init_scale: variance scale of the output layers of the d and alpha heads. Small, so every
      member predicts ~0 change and ~0 alpha at init (alpha = 0 is the safe "do not move" answer),
      but not zero, so that untrained members disagree and confidence starts low.
    min_valid: ``train_step`` leaves params and optimizer state untouched while the window holds
      fewer valid entries than this.
    imagine_sample: if False (default), ``imagine`` filters and rolls out with the latent means;
      if True, with samples as in DreamerV3. Measured on the synthetic curve of the tests,
      sampling adds per-member noise that raised the 8-step error and more than tripled the
      members' disagreement (confidence would then measure sampling noise, not uncertainty).
  """

  feature_dim: int
  n_groups: int
  deter: int = 256
  latent: int = 32
  hidden: int = 256
  ensemble: int = 3
  free_bits: float = 1.0
  kl_dyn_scale: float = 0.5
  kl_rep_scale: float = 0.1
  learning_rate: float = 1e-3
  alpha_max: float = 4.0
  dloss_scale: float = 0.01
  min_std: float = 0.1
  grad_clip: float = 10.0
  head_init_scale: float = 0.1
  min_valid: int = 3
  imagine_sample: bool = False


# --------------------------------------------------------------------------------------------------
# The Flax module (one ensemble member)
# --------------------------------------------------------------------------------------------------


class _MLP(nn.Module):
  """Dense -> LayerNorm -> SiLU, then a linear output layer."""

  hidden: int
  out: int
  out_scale: float

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    # No bias: LayerNorm's own offset makes it redundant.
    x = nn.Dense(self.hidden, use_bias=False)(x)
    x = nn.silu(nn.LayerNorm()(x))
    init = nn.initializers.variance_scaling(self.out_scale, "fan_in", "truncated_normal")
    return nn.Dense(self.out, kernel_init=init, bias_init=nn.initializers.zeros)(x)


class RSSM(nn.Module):
  """One member of the recurrent state-space model. See the module docstring.

  The methods are single steps (or a batch of independent states) so that the caller can drive
  the recurrence with ``jax.lax.scan`` over ``model.apply(params, ..., method=...)``; linen
  modules cannot be called inside a raw jax transform, whereas ``apply`` is a pure function.

  Cost shapes the layout. On CPU the sequential filter and its backward pass dominate, so:

  * the GRU is DreamerV3's fused, layer-normalised GRU: one matmul for all three gates
    (``nn.GRUCell`` issues six, with separate heads the first version's train_step took ~4x as
    long) and an update-gate bias of -1 that keeps h stable early on;
  * every layer that reads the observation is split into an observation part and a state part;
    the observation parts of the whole window are one batched matmul before the scan
    (``embed``);
  * the three heads share one hidden layer, computed batched over the window after the scan;
  * the recurrent kernels' gradients are computed after the backward loop, not inside it
    (``_recurrence_hoisted``).
  """

  cfg: RSSMConfig

  def setup(self) -> None:
    c = self.cfg
    dense = nn.Dense
    # GRU: parts = LN(W_x x_{t-1} + W_s [h_{t-1}, z_{t-1}] + b) -> reset, candidate, update.
    self.gru_x = dense(3 * c.deter)
    self.gru_s = dense(3 * c.deter, use_bias=False)
    self.gru_norm = nn.LayerNorm()
    # Learned initial state (DreamerV3): from h = z = x = 0 the GRU's LayerNorm would see an
    # all-zero vector, whose normalisation has a ~1e3x gradient. tanh keeps it in range.
    self.h_init = self.param("h_init", nn.initializers.normal(1.0), (c.deter,))
    # Posterior q(z | h, x): first layer split into an x part and an h part.
    self.post_x = dense(c.hidden, use_bias=False)
    self.post_h = dense(c.hidden, use_bias=False)
    self.post_norm = nn.LayerNorm()
    small = nn.initializers.variance_scaling(c.head_init_scale, "fan_in", "truncated_normal")
    small_dense = lambda n: dense(n, kernel_init=small, bias_init=nn.initializers.zeros)
    # Prior and posterior start close to the same broad Gaussian (small output init): the
    # initial KL is ~3 nats instead of ~35, whose gradients (norm ~1e4) would dominate early
    # updates.
    self.post_out = small_dense(2 * c.latent)
    self.prior_net = _MLP(c.hidden, 2 * c.latent, out_scale=c.head_init_scale)
    # Heads on s = [h, z]: one shared hidden layer, three linear outputs.
    self.head_in = dense(c.hidden, use_bias=False)
    self.head_norm = nn.LayerNorm()
    self.dloss_out = small_dense(1)
    self.alpha_out = small_dense(c.n_groups)
    # The decoder keeps a normal init: x_hat must carry signal into imagined GRU steps at once.
    self.decoder_out = dense(c.feature_dim)

  def _gaussian(self, raw: jax.Array) -> tuple[jax.Array, jax.Array]:
    mean, std = jnp.split(raw, 2, axis=-1)
    return mean, jax.nn.softplus(std) + self.cfg.min_std

  def initial(self) -> jax.Array:
    """The state h that every window starts from (and that invalid entries hold)."""
    return jnp.tanh(self.h_init)

  def embed(self, x: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The observation-dependent parts of the GRU input and of the posterior's first layer.

    The observation of step t is the feature vector x_t and u_t = symlog(d_{t-1} / dloss_scale),
    the log-loss change that led to step t (see ``_clean_window``).
    """
    obs = jnp.concatenate([x, u[..., None]], axis=-1)
    return self.gru_x(obs), self.post_x(obs)

  def transition(self, h: jax.Array, z: jax.Array, gx_prev: jax.Array) -> jax.Array:
    """h_t = GRU(h_{t-1}, [z_{t-1}, x_{t-1}]), with ``gx_prev = embed(x_{t-1})[0]``."""
    parts = self.gru_norm(gx_prev + self.gru_s(jnp.concatenate([h, z], axis=-1)))
    reset, cand, update = jnp.split(parts, 3, axis=-1)
    cand = jnp.tanh(jax.nn.sigmoid(reset) * cand)
    update = jax.nn.sigmoid(update - 1.0)
    return update * cand + (1.0 - update) * h

  def prior(self, h: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and std of p(z_t | h_t)."""
    return self._gaussian(self.prior_net(h))

  def posterior(self, h: jax.Array, px: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and std of q(z_t | h_t, x_t), with ``px = embed(x_t)[1]``."""
    return self._gaussian(self.post_out(nn.silu(self.post_norm(px + self.post_h(h)))))

  def heads(self, h: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """From s_t = [h_t, z_t]: (d_t / dloss_scale, alpha_t in [-alpha_max, alpha_max], x_hat)."""
    a = nn.silu(self.head_norm(self.head_in(jnp.concatenate([h, z], axis=-1))))
    d = self.dloss_out(a)[..., 0]
    amax = self.cfg.alpha_max
    # A tanh squash that is the identity near 0: bounded alphas, undistorted gradients for the
    # usual |alpha| ~ 1 targets.
    alpha = amax * jnp.tanh(self.alpha_out(a) / amax)
    return d, alpha, self.decoder_out(a)

  def __call__(self, h: jax.Array, z: jax.Array, x: jax.Array, u: jax.Array):
    """One filtering step through every submodule; used for ``init``."""
    h = h + self.initial()
    gx, px = self.embed(x, u)
    h = self.transition(h, z, gx)
    self.prior(h)
    mean, _ = self.posterior(h, px)
    return self.heads(h, mean)


# --------------------------------------------------------------------------------------------------
# State, optimizer, init
# --------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class DynamicsState:
  """Everything the trajectory model carries between training steps (a pytree).

  Attributes:
    params: RSSM parameters stacked on a leading ensemble axis of size E.
    opt_state: optimizer state, also stacked per member.
    h: (E, deter) last filtered deterministic state (from the latest ``train_step`` window).
    z: (E, latent) last filtered posterior sample.
    step: int32, number of optimizer updates actually applied.
  """

  params: Any
  opt_state: Any
  h: jax.Array
  z: jax.Array
  step: jax.Array


def make_optimizer(cfg: RSSMConfig) -> optax.GradientTransformation:
  """Adam with global-norm clipping, applied per ensemble member (the caller vmaps it)."""
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), optax.adam(cfg.learning_rate))


def init_dynamics(rng: jax.Array, cfg: RSSMConfig) -> DynamicsState:
  """Initialises E members with different keys and stacks their params and optimizer states.

  Args:
    rng: any PRNG key. The init's compile time is dominated by its ~20 random draws: an RBG key
      (``jax.random.key(seed, impl="rbg")``) compiles about twice as fast as threefry on CPU.
    cfg: the config.

  Returns:
    A ``DynamicsState`` with ``step = 0`` and zero ``h``/``z``.
  """
  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)  # noqa: E731
  h, z, x = zeros(cfg.deter), zeros(cfg.latent), zeros(cfg.feature_dim)
  params = jax.vmap(lambda k: RSSM(cfg).init(k, h, z, x, zeros()))(jax.random.split(rng, cfg.ensemble))
  return DynamicsState(
    params=params,
    opt_state=jax.vmap(make_optimizer(cfg).init)(params),
    h=zeros(cfg.ensemble, cfg.deter),
    z=zeros(cfg.ensemble, cfg.latent),
    step=jnp.zeros((), jnp.int32),
  )


# --------------------------------------------------------------------------------------------------
# Filtering and the loss
# --------------------------------------------------------------------------------------------------


def _field(window: Any, name: str, dtype: Any = jnp.float32) -> jax.Array:
  return jnp.asarray(window[name] if isinstance(window, Mapping) else getattr(window, name), dtype)


class _Clean(NamedTuple):
  x: jax.Array  # (W, F) features, zero where invalid
  u: jax.Array  # (W,) symlog(d_{t-1} / dloss_scale), zero where step t-1 or t is invalid
  logloss: jax.Array  # (W,) zero where invalid
  alpha: jax.Array  # (W, G) zero where not a target
  valid: jax.Array  # (W,) bool
  pair: jax.Array  # (W,) bool: a target at t, valid[t] & valid[t + 1]
  d: jax.Array  # (W - 1,) logloss[t + 1] - logloss[t] in units of dloss_scale (garbage where not a pair)


def _symlog(v: jax.Array) -> jax.Array:
  return jnp.sign(v) * jnp.log1p(jnp.abs(v))


def _clean_window(window: Any, cfg: RSSMConfig) -> _Clean:
  """Zeroes every entry that is not a usable input or target, and derives the input u.

  ``jnp.where`` downstream is not enough: a NaN in an unselected branch still poisons the gradient
  (0 * NaN), so inputs are sanitised once, here. ``alpha_target[t]`` is kept only where it is a
  target (``valid[t] & valid[t+1]``), so the newest entry -- whose next update the caller has not
  seen yet -- may hold anything.

  u_t, the observed log-loss change into step t, is an extra input channel. The normalised
  features drift with their running statistics, and the model's target (a change of ~1e-3 in
  log-loss, i.e. a few hundredths of a normalised unit) is a fragile function of them; u is in the
  target's own fixed units, so the trend and the current deviation from it are stationary,
  learnable functions of the u history. symlog keeps early-training jumps bounded. In imagination
  the model feeds back its own predicted change.
  """
  valid = _field(window, "valid", bool)
  pair = jnp.concatenate([valid[:-1] & valid[1:], jnp.zeros((1,), bool)])
  x = jnp.where(valid[:, None], _field(window, "x"), 0.0)
  logloss = jnp.where(valid, _field(window, "logloss"), 0.0)
  alpha = jnp.where(pair[:, None], _field(window, "alpha_target"), 0.0)
  d = (logloss[1:] - logloss[:-1]) / cfg.dloss_scale
  u = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.where(pair[:-1], _symlog(d), 0.0)])
  return _Clean(x, u, logloss, alpha, valid, pair, d)


def _filter(params: Any, obs: _Clean, noise: jax.Array, cfg: RSSMConfig):
  """Runs the posterior over a window, from the initial state (truncated BPTT). One member.

  Invalid steps hold the initial state (h0, 0) (and their inputs are already zero), so the first
  valid step always starts from the same state whatever precedes it. Only the recurrence lives in
  the scan; input projections are batched before it, priors and heads after it, which keeps the
  sequential part (the cost driver on CPU) minimal.

  Returns (hs, zs, post_mean, post_std), each with a leading W axis.
  """
  model = RSSM(cfg)
  gx, px = model.apply(params, obs.x, obs.u, method=RSSM.embed)
  gx0, _ = model.apply(params, jnp.zeros_like(obs.x[0]), jnp.zeros(()), method=RSSM.embed)
  gx_prev = jnp.concatenate([gx0[None], gx[:-1]], axis=0)  # GRU input at t is step t-1's
  return _recurrence_hoisted(params, gx_prev, px, model.apply(params, method=RSSM.initial), obs.valid, noise, cfg)


def _recurrence(params, gx_prev, px, h0, valid, noise, cfg: RSSMConfig):
  """The sequential part of ``_filter``: GRU transition and posterior sample, step by step."""
  model = RSSM(cfg)

  def body(carry, inp):
    h, z = carry
    gx_t, px_t, v_t, eps = inp
    h_new = model.apply(params, h, z, gx_t, method=RSSM.transition)
    # Masked before the posterior reads it, so that the posterior's input is exactly the
    # output ``hs[t]``, which the hoisted gradient below relies on.
    h_new = jnp.where(v_t, h_new, h0)
    mean, std = model.apply(params, h_new, px_t, method=RSSM.posterior)
    z_new = jnp.where(v_t, mean + std * eps, 0.0)
    return (h_new, z_new), (h_new, z_new, mean, std)

  return jax.lax.scan(body, (h0, jnp.zeros((cfg.latent,), jnp.float32)), (gx_prev, px, valid, noise))[1]


# Gradient hoisting. Reverse-mode through ``lax.scan`` accumulates the gradient of every weight the
# body closes over inside the backward loop: for the two big recurrent matrices (the GRU's state
# kernel, 288x768, and the posterior's h kernel, 256x256) that is a full-size read-modify-write per
# step and member. But each enters the body as ``input_t @ K`` added to a per-step scan input
# (``gx_prev[t]`` resp. ``px[t]``), so dL/dK = sum_t input_t^T dL/d(scan input_t): one matmul after
# the backward loop, from cotangents the backward loop computes anyway. Same gradient (tested
# against plain autodiff), ~2.5 ms less per train_step at the default sizes on CPU.
_HOISTED = (("gru_s", "kernel"), ("post_h", "kernel"))


def _with_kernels(params: Any, kernels: tuple) -> Any:
  """``params`` with the ``_HOISTED`` leaves replaced (structure, dict or FrozenDict, kept)."""
  lookup = dict(zip(_HOISTED, kernels))

  def swap(path, leaf):
    return lookup.get(tuple(getattr(k, "key", None) for k in path[-2:]), leaf)

  return jax.tree_util.tree_map_with_path(swap, params)


# ``_recurrence`` with the recurrent-kernel gradients computed outside the backward loop.
_recurrence_hoisted = jax.custom_vjp(_recurrence, nondiff_argnums=(6,))


def _recurrence_hoisted_fwd(params, gx_prev, px, h0, valid, noise, cfg):
  kernels = tuple(params["params"][m][n] for m, n in _HOISTED)

  def run(params, gx_prev, px, h0):
    # The kernels are closed-over constants here, so the scan's backward pass propagates
    # through them (K^T delta) but does not accumulate their gradients.
    return _recurrence(_with_kernels(params, kernels), gx_prev, px, h0, valid, noise, cfg)

  out, vjp_fn = jax.vjp(run, params, gx_prev, px, h0)
  return out, (vjp_fn, h0, out[0], out[1])


def _recurrence_hoisted_bwd(cfg, res, ct):
  vjp_fn, h0, hs, zs = res
  d_params, d_gx, d_px, d_h0 = vjp_fn(ct)
  # The matmul inputs of every step, from the outputs: the GRU reads the previous (h, z) (the
  # initial (h0, 0) at t = 0), the posterior reads the new h.
  h_prev = jnp.concatenate([h0[None], hs[:-1]])
  z_prev = jnp.concatenate([jnp.zeros_like(zs[:1]), zs[:-1]])
  gru_in = jnp.concatenate([h_prev, z_prev], axis=-1)
  return _with_kernels(d_params, (gru_in.T @ d_gx, hs.T @ d_px)), d_gx, d_px, d_h0, None, None


_recurrence_hoisted.defvjp(_recurrence_hoisted_fwd, _recurrence_hoisted_bwd)


def _gauss_kl(m1: jax.Array, s1: jax.Array, m2: jax.Array, s2: jax.Array) -> jax.Array:
  """KL(N(m1, s1) || N(m2, s2)), summed over the last axis."""
  return (jnp.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2.0 * s2**2) - 0.5).sum(-1)


def _masked_mean(v: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(v.dtype)
  return (v * m).sum() / jnp.maximum(m.sum(), 1.0)


def _member_loss(params: Any, obs: _Clean, rng: jax.Array, cfg: RSSMConfig):
  """Loss of one member on a cleaned window; returns (loss, (components, (h_last, z_last)))."""
  model = RSSM(cfg)
  x, valid, pair = obs.x, obs.valid, obs.pair[:-1]  # targets at t need step t+1
  hs, zs, q_mean, q_std = _filter(params, obs, jax.random.normal(rng, (x.shape[0], cfg.latent), jnp.float32), cfg)
  p_mean, p_std = model.apply(params, hs, method=RSSM.prior)
  d_pred, alpha_pred, x_hat = model.apply(params, hs, zs, method=RSSM.heads)

  loss_d = _masked_mean((d_pred[:-1] - obs.d) ** 2, pair)
  loss_alpha = _masked_mean(((alpha_pred[:-1] - obs.alpha[:-1]) ** 2).mean(-1), pair)
  # Mean over features (not the DreamerV3 sum): keeps the term O(1) whatever F is.
  loss_recon = _masked_mean(((x_hat - x) ** 2).mean(-1), valid)

  sg = jax.lax.stop_gradient
  kl_dyn = _gauss_kl(sg(q_mean), sg(q_std), p_mean, p_std)  # moves the prior
  kl_rep = _gauss_kl(q_mean, q_std, sg(p_mean), sg(p_std))  # moves the posterior
  loss_dyn = _masked_mean(jnp.maximum(kl_dyn, cfg.free_bits), valid)
  loss_rep = _masked_mean(jnp.maximum(kl_rep, cfg.free_bits), valid)

  loss = loss_d + loss_alpha + loss_recon + cfg.kl_dyn_scale * loss_dyn + cfg.kl_rep_scale * loss_rep
  comps = {
    "loss": loss,
    "loss_dloss": loss_d,
    "loss_alpha": loss_alpha,
    "loss_recon": loss_recon,
    "kl_dyn": loss_dyn,
    "kl_rep": loss_rep,
    "kl": _masked_mean(kl_dyn, valid),  # raw, before free bits
  }
  return loss, (comps, (hs[-1], zs[-1]))


def _ensemble_loss(params: Any, window: Any, rng: jax.Array, cfg: RSSMConfig):
  obs = _clean_window(window, cfg)
  member = lambda p, k: _member_loss(p, obs, k, cfg)
  losses, (comps, last) = jax.vmap(member)(params, jax.random.split(rng, cfg.ensemble))
  aux = {k: v.mean() for k, v in comps.items()}
  aux["n_valid"] = obs.valid.sum().astype(jnp.int32)
  # Sum, not mean: members' params are disjoint, so each member gets exactly its own gradient.
  return losses.sum(), (aux, last)


def dynamics_loss(params: Any, window: Any, rng: jax.Array, cfg: RSSMConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Training loss of the stacked ensemble on one window.

  Each member filters the window from its learned initial state with its own posterior noise.
  The loss is, per member and masked by validity (targets need valid[t] & valid[t+1]),

    MSE(d_t / dloss_scale) + MSE(alpha_t) + MSE(x_hat_t)      [all O(1); means over G and F]
    + kl_dyn_scale * max(free_bits, KL(sg(q) || p))
    + kl_rep_scale * max(free_bits, KL(q || sg(p)))

  summed over members (params are disjoint, so this is each member's own loss for its gradient).

  Args:
    params: stacked params (leading axis E).
    window: mapping/object with x (W, F), logloss (W,), alpha_target (W, G), valid (W,).
    rng: PRNG key for the posterior samples.
    cfg: the config.

  Returns:
    (loss, aux): a scalar, and a dict of scalars (member means): ``loss``, ``loss_dloss``,
    ``loss_alpha``, ``loss_recon``, ``kl_dyn``, ``kl_rep`` (with free bits), ``kl`` (raw KL) and
    ``n_valid``.
  """
  loss, (aux, _) = _ensemble_loss(params, window, rng, cfg)
  return loss, aux


# --------------------------------------------------------------------------------------------------
# Training and imagination
# --------------------------------------------------------------------------------------------------


def train_step(
  dyn_state: DynamicsState, window: Any, rng: jax.Array, cfg: RSSMConfig
) -> tuple[DynamicsState, dict[str, jax.Array]]:
  """One optimizer step of every member on ``window``. Pure and jittable (``cfg`` static).

  The update is applied only when the window holds at least ``cfg.min_valid`` valid entries and
  the loss and gradients are finite; otherwise params and optimizer state pass through unchanged.
  The gate is a ``lax.cond`` (no Python branching on traced values, so it nests inside
  ``lax.switch``, ``lax.cond`` and ``lax.scan``; under ``vmap`` it becomes a select). A cond
  rather than a ``jnp.where`` over the trees because that select re-reads and re-writes every
  parameter and both Adam moments each step: measured ~1 ms of a ~9 ms step at the default
  sizes on CPU.
  ``h``/``z`` always become the final filtered posterior state of this window.

  Returns:
    (new_state, metrics): metrics holds the ``dynamics_loss`` aux scalars plus ``grad_norm`` (mean
    over members, before clipping) and ``updated`` (bool).
  """
  (_, (aux, (h_last, z_last))), grads = jax.value_and_grad(_ensemble_loss, has_aux=True)(
    dyn_state.params, window, rng, cfg
  )
  # Per-member global norm (written out: optax.global_norm is deprecated, optax.tree is recent).
  grad_norm = jnp.sqrt(sum(jnp.sum(g * g, axis=tuple(range(1, g.ndim))) for g in jax.tree.leaves(grads)))  # (E,)
  ok = (aux["n_valid"] >= cfg.min_valid) & jnp.isfinite(aux["loss"]) & jnp.all(jnp.isfinite(grad_norm))

  def update(grads, opt_state, params):
    # vmapped: every member has its own clipping and Adam statistics.
    updates, opt_state = jax.vmap(make_optimizer(cfg).update)(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  skip = lambda grads, opt_state, params: (params, opt_state)
  params, opt_state = jax.lax.cond(ok, update, skip, grads, dyn_state.opt_state, dyn_state.params)
  return DynamicsState(
    params=params, opt_state=opt_state, h=h_last, z=z_last, step=dyn_state.step + ok.astype(jnp.int32)
  ), {**aux, "grad_norm": grad_norm.mean(), "updated": ok}


def imagine(
  dyn_state: DynamicsState,
  window: Any,
  horizon_max: int,
  rng: jax.Array,
  cfg: RSSMConfig,
) -> dict[str, jax.Array]:
  """Filters ``window`` with the posterior, then rolls each member ``horizon_max`` prior steps.

  Alignment: the filtered state s_T of the last valid entry T predicts the change to T+1 and the
  alpha of the first predicted update. Later states come from the prior; the GRU input of an
  imagined state is its decoded x_hat and its own predicted incoming change (o_T itself is real,
  so the first transition uses it). With ``cfg.imagine_sample`` False (default) latents are means
  and the result does not depend on ``rng``.

  Args:
    dyn_state: the model state (only ``params`` is used).
    window: as for ``dynamics_loss``.
    horizon_max: H, static number of imagined steps (callers use a prefix of length <= H).
    rng: PRNG key (posterior and prior samples, independent per member; unused by default).
    cfg: the config.

  Returns:
    dict with
      ``logloss``: (E, H) predicted log-loss after k = 1..H steps, cumulative from the last valid
        observed log-loss;
      ``dlogloss``: (E, H) the per-step predicted changes;
      ``alpha``: (E, H, G) predicted scales for steps 1..H, in [-alpha_max, alpha_max];
      ``next_logloss``: (E,) the one-step prediction (= ``logloss[:, 0]``).
  """
  obs = _clean_window(window, cfg)
  W = obs.x.shape[0]
  model = RSSM(cfg)
  # Invalid entries only ever form a prefix, so this is W-1 whenever anything is valid; computing
  # it keeps the result consistent even if a caller passes trailing invalid entries.
  last = W - 1 - jnp.argmax(obs.valid[::-1])
  x_last, u_last, ll_last = obs.x[last], obs.u[last], obs.logloss[last]

  def member(params, key):
    # Samples, or the means: z = mean + std * 0.
    draw = jax.random.normal if cfg.imagine_sample else lambda _, shape: jnp.zeros(shape, jnp.float32)
    k_post, k_prior = jax.random.split(key)
    noise, eps = draw(k_post, (W, cfg.latent)), draw(k_prior, (horizon_max, cfg.latent))
    hs, zs, _, _ = _filter(params, obs, noise, cfg)

    def body(carry, inp):
      h, z, ll, d_prev = carry
      k, e = inp
      d, alpha, x_hat = model.apply(params, h, z, method=RSSM.heads)
      ll = ll + d * cfg.dloss_scale
      # The state's own observation is real only for k == 0; afterwards the decoder stands in
      # for x and the previous predicted change for u.
      first = k == 0
      gx, _ = model.apply(
        params, jnp.where(first, x_last, x_hat), jnp.where(first, u_last, _symlog(d_prev)), method=RSSM.embed
      )
      h = model.apply(params, h, z, gx, method=RSSM.transition)
      mean, std = model.apply(params, h, method=RSSM.prior)
      return (h, mean + std * e, ll, d), (ll, d * cfg.dloss_scale, alpha)

    # (lls, ds, alphas)
    return jax.lax.scan(
      body, (hs[last], zs[last], ll_last, jnp.zeros((), jnp.float32)), (jnp.arange(horizon_max), eps)
    )[1]

  lls, ds, alphas = jax.vmap(member)(dyn_state.params, jax.random.split(rng, cfg.ensemble))
  return {"logloss": lls, "dlogloss": ds, "alpha": alphas, "next_logloss": lls[:, 0]}


def ensemble_disagreement(pred: jax.Array) -> jax.Array:
  """Mean over all trailing entries of the standard deviation across members (axis 0)."""
  return jnp.std(pred, axis=0).mean()
