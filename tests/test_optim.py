"""hybridjax.optim: the schedule, the optimizer, the guarded update and the baseline train step."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridjax import config as config_lib
from hybridjax import optim, preflight
from hybridjax.models import mlp
from hybridjax.optimizers import user as user_optimizer

MODEL = mlp.MLP(features=(16, 16), n_out=1)
X, Y = mlp.make_regression_problem(0, n_in=4)
LOSS_FN = mlp.make_loss_fn(MODEL)


def _params(seed=0):
  return MODEL.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4)))["params"]


def _batch(i, batch_size=32):
  return mlp.regression_batch(X, Y, step=i, batch_size=batch_size, seed=0)


def _optim_config(**kw):
  c = config_lib.default_optim_config()
  c.update(kw)
  return c


# --- the schedule ---------------------------------------------------------------------------------


def test_schedule_warmup_and_cosine_at_known_points():
  sched = optim.make_schedule(_optim_config(learning_rate=1.0, warmup_steps=10, min_lr_ratio=0.1), 100)
  lr = functools.partial(optim.learning_rate, sched)
  assert float(lr(0)) == 0.0
  assert float(lr(5)) == pytest.approx(0.5)
  np.testing.assert_allclose(float(lr(10)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(lr(55)), 0.55, rtol=1e-5)  # half-way down the cosine
  np.testing.assert_allclose(float(lr(100)), 0.1, rtol=1e-5)
  np.testing.assert_allclose(float(lr(10_000)), 0.1, rtol=1e-5)  # the floor after the end


def test_make_schedule_fields():
  # decay_steps 0 = the run's length; a warm-up as long as the schedule is cut to fit inside it.
  s = optim.make_schedule(_optim_config(learning_rate=2e-3, warmup_steps=7, decay_steps=0, min_lr_ratio=0.25), 300)
  assert (float(s.peak_lr), int(s.warmup_steps), int(s.decay_steps)) == (pytest.approx(2e-3), 7, 300)
  assert float(s.min_lr_ratio) == 0.25
  assert s.peak_lr.dtype == jnp.float32 and s.warmup_steps.dtype == jnp.int32
  s = optim.make_schedule(_optim_config(warmup_steps=50, decay_steps=40), 300)
  assert (int(s.warmup_steps), int(s.decay_steps)) == (39, 40)
  s = optim.make_schedule(_optim_config(warmup_steps=5), 1)
  assert (int(s.warmup_steps), int(s.decay_steps)) == (0, 1)


_lr_many = jax.jit(lambda sched, steps: optim.learning_rate(sched, steps))


@settings(max_examples=40, deadline=None)
@given(
  peak=st.floats(1e-5, 1.0),
  warmup=st.integers(0, 60),
  decay_extra=st.integers(1, 400),
  ratio=st.floats(0.0, 1.0),
)
def test_learning_rate_equals_optax_warmup_cosine_decay(peak, warmup, decay_extra, ratio):
  decay = warmup + decay_extra
  sched = optim.Schedule(
    peak_lr=jnp.float32(peak),
    warmup_steps=jnp.int32(warmup),
    decay_steps=jnp.int32(decay),
    min_lr_ratio=jnp.float32(ratio),
  )
  ref = optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=decay, end_value=peak * ratio
  )
  # Every step of the schedule for the shape checks; optax (eager, slow) at the boundaries and a
  # spread of steps in between.
  every = np.asarray(_lr_many(sched, jnp.arange(decay + 20)))
  assert np.all(every >= 0) and np.all(every <= peak * (1 + 1e-6))
  assert np.all(np.diff(every[warmup:]) <= 1e-6 * peak)  # never rises after the warm-up
  edges = [0, 1, warmup - 1, warmup, warmup + 1, decay - 1, decay, decay + 1, decay + 19]
  steps = np.unique(np.clip(np.concatenate([edges, np.linspace(0, decay + 19, 16).astype(int)]), 0, decay + 19))
  theirs = np.asarray([ref(int(s)) for s in steps])
  np.testing.assert_allclose(every[steps], theirs, rtol=2e-5, atol=1e-6 * peak)


# --- the optimizer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_with_learning_rate_sets_the_injected_learning_rate(name):
  # int-valued config entries are injected as floats, and the update is proportional to the rate.
  tx = optim.make_optimizer(_optim_config(name=name, weight_decay=0, grad_clip=0))
  params = {"w": jnp.linspace(-1.0, 1.0, 9).reshape(3, 3), "b": jnp.ones((3,))}
  grads = jax.tree.map(lambda p: 0.1 * p + 0.3, params)
  state = tx.init(params)
  inject = [
    n for n in jax.tree.leaves(state, is_leaf=user_optimizer._is_inject_state) if user_optimizer._is_inject_state(n)
  ]
  assert len(inject) == 1
  assert all(jnp.asarray(v).dtype == jnp.float32 for v in inject[0].hyperparams.values())

  def update(lr):
    s = optim.with_learning_rate(state, jnp.float32(lr))
    (hp,) = [
      n for n in jax.tree.leaves(s, is_leaf=user_optimizer._is_inject_state) if user_optimizer._is_inject_state(n)
    ]
    assert float(hp.hyperparams["learning_rate"]) == pytest.approx(lr)
    return tx.update(grads, s, params)[0]

  small, large = update(0.25), update(0.5)
  assert all(float(jnp.max(jnp.abs(u))) > 0 for u in jax.tree.leaves(small))
  chex.assert_trees_all_close(large, jax.tree.map(lambda u: 2.0 * u, small), rtol=1e-6)
  # The injected rate is the whole story: the optimizer's own count does not move it.
  chex.assert_trees_all_equal(update(0.0), jax.tree.map(jnp.zeros_like, small))


def test_make_optimizer_rejects_unknown_names():
  with pytest.raises(ValueError, match="optim.name"):
    optim.make_optimizer(_optim_config(name="adagrad"))


def test_grad_clip_is_applied_before_the_update():
  tx = optim.make_optimizer(_optim_config(name="sgd", grad_clip=1.0))
  params = {"w": jnp.zeros((4,))}
  state = optim.with_learning_rate(tx.init(params), 1.0)
  updates, _ = tx.update({"w": jnp.full((4,), 100.0)}, state, params)
  np.testing.assert_allclose(float(optim.global_norm(updates)), 1.0, rtol=1e-6)


class GradAccumulationTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_grad_accumulation_matches_full_batch(self):
    params, batch = _params(), _batch(0, batch_size=16)
    full = self.variant(lambda p, b: optim.loss_and_grads(LOSS_FN, p, b, 1))(params, batch)
    acc = self.variant(lambda p, b: optim.loss_and_grads(LOSS_FN, p, b, 4))(params, batch)
    chex.assert_trees_all_close(full, acc, rtol=1e-5, atol=1e-6)


# --- small helpers ------------------------------------------------------------------------------------


def test_global_norm_tree_where_and_all_finite():
  tree = {"a": jnp.asarray([3.0, 0.0]), "b": jnp.asarray([[4.0]], jnp.bfloat16), "i": jnp.asarray([7], jnp.int32)}
  np.testing.assert_allclose(float(optim.global_norm({"a": tree["a"], "b": tree["b"]})), 5.0, rtol=1e-6)
  other = jax.tree.map(jnp.zeros_like, tree)
  chex.assert_trees_all_equal(optim.tree_where(jnp.bool_(True), tree, other), tree)
  chex.assert_trees_all_equal(optim.tree_where(jnp.bool_(False), tree, other), other)
  assert bool(optim.all_finite(tree))
  assert not bool(optim.all_finite({**tree, "a": jnp.asarray([1.0, jnp.inf])}))
  assert not bool(optim.all_finite({**tree, "b": jnp.asarray([[jnp.nan]], jnp.bfloat16)}))
  assert bool(optim.all_finite({"i": jnp.asarray([1], jnp.int32)}))  # integers are always finite
  assert bool(optim.all_finite({}))


def test_guarded_update_skips_a_non_finite_update_and_counts_it():
  tx = optim.make_optimizer(_optim_config())
  params = _params()
  state = optim.init_train_state(params, tx)
  grads = jax.tree.map(jnp.ones_like, params)
  lr = jnp.float32(1e-2)
  new_p, new_opt, updates = optim.guarded_update(tx, grads, state.opt_state, params, lr, jnp.bool_(True))
  assert all(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(jax.tree.leaves(new_p), jax.tree.leaves(params)))
  chex.assert_trees_all_close(new_p, optax.apply_updates(params, updates))
  bad = jax.tree.map(lambda g: g * jnp.nan, grads)
  kept_p, kept_opt, _ = optim.guarded_update(tx, bad, state.opt_state, params, lr, jnp.bool_(False))
  chex.assert_trees_all_equal(kept_p, params)
  chex.assert_trees_all_equal(kept_opt, state.opt_state)
  # The counters: a skipped step adds to the streak and the total; a good one resets the streak.
  s1 = optim.next_train_state(state, kept_p, kept_opt, jnp.bool_(False))
  s2 = optim.next_train_state(s1, kept_p, kept_opt, jnp.bool_(False))
  s3 = optim.next_train_state(s2, new_p, new_opt, jnp.bool_(True))
  assert [(int(s.step), int(s.nonfinite_streak), int(s.nonfinite_total)) for s in (s1, s2, s3)] == [
    (1, 1, 1),
    (2, 2, 2),
    (3, 0, 2),
  ]


# --- the baseline train step ----------------------------------------------------------------------


def _jitted_step(tx, loss_fn=LOSS_FN, grad_accum=1):
  return jax.jit(functools.partial(optim.train_step, loss_fn=loss_fn, tx=tx, grad_accum=grad_accum), donate_argnums=0)


def test_train_step_donates_and_learns():
  oc = _optim_config(learning_rate=1e-2, warmup_steps=0)
  tx = optim.make_optimizer(oc)
  step = _jitted_step(tx)
  schedule = optim.make_schedule(oc, 200)
  state = optim.init_train_state(_params(), tx)
  losses = []
  for i in range(60):
    old = state
    state, m = step(state, _batch(i), schedule)
    losses.append(float(m["loss"]))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old))
  assert int(state.step) == 60 and int(state.nonfinite_total) == 0
  assert losses[-1] < 0.5 * losses[0]


def test_one_compiled_train_step_serves_every_learning_rate_and_length():
  traces = []

  def counting_loss(p, b):
    traces.append(1)  # runs once per trace, never per call
    return LOSS_FN(p, b)

  oc = _optim_config(name="sgd", grad_clip=0, weight_decay=0.0)
  tx = optim.make_optimizer(oc)
  step = _jitted_step(tx, counting_loss)
  a = optim.make_schedule(_optim_config(learning_rate=1e-2, warmup_steps=0), 100)
  b = optim.make_schedule(_optim_config(learning_rate=3e-4, warmup_steps=20, min_lr_ratio=0.5), 5000)
  _, grads = optim.loss_and_grads(LOSS_FN, _params(), _batch(0))
  rates = []
  for sched in (a, b):
    state = optim.init_train_state(_params(), tx)
    state = state.replace(step=jnp.int32(30))  # past b's warm-up: both at a known rate
    new, _ = step(state, _batch(0), sched)
    # One SGD step (its momentum trace starts at the gradient): params - lr * grad.
    lr = float(optim.learning_rate(sched, 30))
    chex.assert_trees_all_close(
      new.params, jax.tree.map(lambda p, g: p - lr * g, _params(), grads), rtol=1e-6, atol=1e-8
    )
    rates.append(lr)
  assert rates[0] > 10 * rates[1] > 0
  assert step._cache_size() == 1 and len(traces) == 1


def test_train_step_skips_a_non_finite_batch():
  oc = _optim_config(learning_rate=1e-2, warmup_steps=0)
  tx = optim.make_optimizer(oc)

  def faulty(p, b):
    loss, aux = LOSS_FN(p, b)
    return loss * b["scale"], aux

  step = _jitted_step(tx, faulty)
  schedule = optim.make_schedule(oc, 100)
  state = optim.init_train_state(_params(), tx)
  state, _ = step(state, {**_batch(0), "scale": np.float32(1.0)}, schedule)
  before = jax.device_get(state)
  state, m = step(state, {**_batch(1), "scale": np.float32(np.nan)}, schedule)
  assert np.isnan(float(m["loss"]))
  chex.assert_trees_all_equal(jax.device_get(state.params), before.params)
  chex.assert_trees_all_equal(jax.device_get(state.opt_state), before.opt_state)
  assert (int(state.step), int(state.nonfinite_streak), int(state.nonfinite_total)) == (2, 1, 1)
  state, _ = step(state, {**_batch(2), "scale": np.float32(1.0)}, schedule)
  assert (int(state.nonfinite_streak), int(state.nonfinite_total)) == (0, 1)


# --- the WSD schedule -----------------------------------------------------------------------------


def test_wsd_schedule_at_known_points():
  oc = _optim_config(schedule="wsd", learning_rate=1.0, warmup_steps=10, min_lr_ratio=0.1, decay_fraction=0.2)
  sched = optim.make_schedule(oc, 100)
  assert sched.kind == "wsd" and sched.decay_start.dtype == jnp.int32
  assert (int(sched.warmup_steps), int(sched.decay_start), int(sched.decay_steps)) == (10, 80, 100)
  lr = jax.jit(optim.learning_rate)
  assert float(lr(sched, 0)) == 0.0
  assert float(lr(sched, 5)) == pytest.approx(0.5)  # the same warm-up as cosine
  for stable in (10, 11, 50, 79, 80):  # the peak from the end of the warm-up to the start of the decay
    assert float(lr(sched, stable)) == 1.0, stable
  np.testing.assert_allclose(float(lr(sched, 85)), 1.0 - 0.9 * 0.25, rtol=1e-6)
  np.testing.assert_allclose(float(lr(sched, 90)), 0.55, rtol=1e-6)  # the linear midpoint
  np.testing.assert_allclose(float(lr(sched, 100)), 0.1, rtol=1e-6)  # the floor at the end
  np.testing.assert_allclose(float(lr(sched, 10_000)), 0.1, rtol=1e-6)  # and after it
  every = np.asarray(lr(sched, jnp.arange(120)))
  assert np.all(np.diff(every[10:]) <= 0) and np.all(np.diff(every[80:101]) < 0)
  # The decay never starts inside the warm-up, and lasts at least one step.
  s = optim.make_schedule(_optim_config(schedule="wsd", warmup_steps=10, decay_fraction=1.0), 100)
  assert int(s.decay_start) == 10
  s = optim.make_schedule(_optim_config(schedule="wsd", warmup_steps=10, decay_fraction=0.001), 100)
  assert int(s.decay_start) == 99
  np.testing.assert_allclose(float(lr(s, 100)), float(s.peak_lr * s.min_lr_ratio), rtol=1e-6)
  # The cosine schedule is unchanged by the new fields: it decays from the end of the warm-up.
  cos = optim.make_schedule(_optim_config(learning_rate=1.0, warmup_steps=10, min_lr_ratio=0.1), 100)
  assert cos.kind == "cosine" and int(cos.decay_start) == 10
  np.testing.assert_allclose(float(lr(cos, 55)), 0.55, rtol=1e-5)


def test_make_schedule_rejects_unknown_kinds():
  with pytest.raises(ValueError, match="optim.schedule"):
    optim.make_schedule(_optim_config(schedule="linear"), 100)


def test_one_compiled_train_step_serves_every_wsd_learning_rate_and_length():
  traces = []

  def counting_loss(p, b):
    traces.append(1)  # runs once per trace, never per call
    return LOSS_FN(p, b)

  tx = optim.make_optimizer(_optim_config(name="sgd", grad_clip=0, weight_decay=0.0))
  step = _jitted_step(tx, counting_loss)
  # At step 30: a is an eighth of the way down its decay (start 20, end 100), b at its stable peak.
  a = optim.make_schedule(_optim_config(schedule="wsd", learning_rate=1e-2, warmup_steps=0, decay_fraction=0.8), 100)
  b = optim.make_schedule(
    _optim_config(schedule="wsd", learning_rate=3e-4, warmup_steps=20, min_lr_ratio=0.5, decay_fraction=0.1), 5000
  )
  _, grads = optim.loss_and_grads(LOSS_FN, _params(), _batch(0))
  rates = []
  for sched, expected in ((a, 1e-2 * (0.9 * (1 - 10 / 80) + 0.1)), (b, 3e-4)):
    state = optim.init_train_state(_params(), tx)
    state = state.replace(step=jnp.int32(30))
    new, _ = step(state, _batch(0), sched)
    lr = float(optim.learning_rate(sched, 30))
    np.testing.assert_allclose(lr, expected, rtol=1e-6)
    chex.assert_trees_all_close(
      new.params, jax.tree.map(lambda p, g: p - lr * g, _params(), grads), rtol=1e-6, atol=1e-8
    )
    rates.append(lr)
  assert rates[0] > 10 * rates[1] > 0
  assert step._cache_size() == 1 and len(traces) == 1


# --- Muon -------------------------------------------------------------------------------------------


@functools.cache
def _gpt2_micro_params():
  """The params of the GPT-2 `tiny,micro` preset's model (one block, tied head)."""
  from experiments.configs import gpt2_small
  from hybridjax.models import gpt2

  c = gpt2_small.get_config("tiny,micro")
  model = gpt2.GPT2(gpt2.GPT2Config(**c.model.to_dict()))
  return model.init(jax.random.PRNGKey(0), jnp.zeros((1, c.model.n_ctx), jnp.int32))["params"]


def _labels_by_path(params):
  flat = jax.tree_util.tree_flatten_with_path(optim.muon_labels(params))[0]
  return {"/".join(str(k.key) for k in path): label for path, label in flat}


def test_muon_touches_only_the_hidden_matrices():
  labels = _labels_by_path(_gpt2_micro_params())
  muon = {path for path, label in labels.items() if label == "muon"}
  assert muon == {
    "h_0/attn/c_attn/kernel",
    "h_0/attn/c_proj/kernel",
    "h_0/mlp/c_fc/kernel",
    "h_0/mlp/c_proj/kernel",
  }
  assert set(labels.values()) == {"muon", "adamw"}
  # The 2-D embeddings (the head is tied to wte) stay on AdamW, like the biases and LayerNorms.
  assert labels["wte/embedding"] == labels["wpe/embedding"] == labels["ln_f/scale"] == "adamw"
  # Labels need only shapes.
  assert _labels_by_path(jax.eval_shape(_gpt2_micro_params)) == labels


def _one_update(oc, params, grads, lr):
  tx = optim.make_optimizer(oc)
  return tx.update(grads, optim.with_learning_rate(tx.init(params), jnp.float32(lr)), params)[0]


def _split(tree, labels):
  """(muon leaves, adamw leaves) of `tree` as two flat lists."""
  pairs = list(zip(jax.tree.leaves(tree), jax.tree.leaves(labels)))
  return [x for x, lab in pairs if lab == "muon"], [x for x, lab in pairs if lab == "adamw"]


@pytest.mark.slow  # two optimizers compiled on a GPT-2 (9 s); the default suite keeps Muon's own update tests
def test_muon_update_equals_adamw_off_the_hidden_matrices():
  params = _gpt2_micro_params()
  labels = optim.muon_labels(params)
  grads = jax.tree.map(lambda p: jnp.sin(3.0 * p + 1.0), params)
  lr = 1e-2
  adamw = _split(_one_update(_optim_config(), params, grads, lr), labels)
  muon = _split(_one_update(_optim_config(name="muon", adam_lr_ratio=1.0), params, grads, lr), labels)
  chex.assert_trees_all_close(muon[1], adamw[1], rtol=1e-6, atol=1e-9)
  assert len(muon[0]) == 4
  for m, a in zip(*(muon[0], adamw[0])):
    assert not np.allclose(m, a, rtol=0.1), "a hidden matrix got AdamW's update"
  # adam_lr_ratio scales the AdamW group's update (AdamW's step is proportional to its rate), and
  # leaves the Muon group alone.
  half = _split(_one_update(_optim_config(name="muon", adam_lr_ratio=0.5), params, grads, lr), labels)
  chex.assert_trees_all_close(half[1], [0.5 * u for u in adamw[1]], rtol=1e-6, atol=1e-9)
  chex.assert_trees_all_equal(half[0], muon[0])
  # muon_weight_decay adds -lr * wd * p on the Muon group only.
  decayed = _split(
    _one_update(_optim_config(name="muon", adam_lr_ratio=1.0, muon_weight_decay=0.5), params, grads, lr), labels
  )
  muon_params, _ = _split(params, labels)
  chex.assert_trees_all_close(
    decayed[0], [u - lr * 0.5 * p for u, p in zip(muon[0], muon_params)], rtol=1e-5, atol=1e-8
  )
  chex.assert_trees_all_equal(decayed[1], muon[1])


def test_with_learning_rate_reaches_both_muon_groups():
  params = _gpt2_micro_params()
  labels = optim.muon_labels(params)
  grads = jax.tree.map(lambda p: jnp.cos(2.0 * p) + 0.1, params)
  tx = optim.make_optimizer(_optim_config(name="muon", muon_weight_decay=0.1))
  state = tx.init(params)
  inject = [
    n for n in jax.tree.leaves(state, is_leaf=user_optimizer._is_inject_state) if user_optimizer._is_inject_state(n)
  ]
  assert len(inject) == 2  # one per group
  assert all(jnp.asarray(v).dtype == jnp.float32 for n in inject for v in n.hyperparams.values())

  def update(lr):
    s = optim.with_learning_rate(state, jnp.float32(lr))
    hps = [n for n in jax.tree.leaves(s, is_leaf=user_optimizer._is_inject_state) if user_optimizer._is_inject_state(n)]
    assert [float(n.hyperparams["learning_rate"]) for n in hps] == [pytest.approx(lr)] * 2
    return _split(tx.update(grads, s, params)[0], labels)

  small, large = update(0.25), update(0.5)
  for group in (0, 1):
    assert all(float(jnp.max(jnp.abs(u))) > 0 for u in small[group])
    chex.assert_trees_all_close(large[group], [2.0 * u for u in small[group]], rtol=1e-5, atol=1e-9)
  zero = update(0.0)
  chex.assert_trees_all_equal(zero, jax.tree.map(jnp.zeros_like, small))


def _gpt2_micro_grads(params, seed):
  return jax.tree.map(lambda p: jnp.sin((3.0 + seed) * p + seed) + 0.1 * seed, params)


def test_a_tied_head_gets_adam_settings_of_its_own_under_muon_groups():
  """The records #3-#7 gave the tied embedding-head matrix AdamW at about 0.36 of Muon's rate with
  betas (0.9, 0.95) and eps 1e-8 (`optim.tied_*`): two steps move it as that Adam does. At their
  defaults (the untied head's settings) the tied head shares the 'head' group, and the optimizer
  state keeps the layout it had before the fields existed."""
  params = _gpt2_micro_params()
  plain = _optim_config(name="muon_groups", grad_clip=0.0)
  assert set(optim.make_optimizer(plain).init(params).inner_states) == {"muon", "muon_qkv", "embed", "head", "scalar"}
  oc = _optim_config(name="muon_groups", grad_clip=0.0, tied_lr_ratio=0.36, tied_b1=0.9, tied_eps=1e-8)
  tx = optim.make_optimizer(oc)
  state = optim.with_learning_rate(tx.init(params), jnp.float32(0.01))
  assert "tied_head" in state.inner_states
  adam = optax.adam(0.01 * 0.36, b1=0.9, b2=0.95, eps=1e-8)
  adam_state = adam.init(params["wte"]["embedding"])
  for seed in (1, 2):  # two steps: the second depends on b1 and b2
    grads = _gpt2_micro_grads(params, seed)
    updates, state = tx.update(grads, state, params)
    want, adam_state = adam.update(grads["wte"]["embedding"], adam_state)
    chex.assert_trees_all_close(updates["wte"]["embedding"], want, rtol=1e-5, atol=1e-9)
  # The untied head's ratio does not reach the tied head: its first step is the same.
  oc.head_lr_ratio = 5.0
  other = optim.make_optimizer(oc)
  grads = _gpt2_micro_grads(params, 1)
  u = other.update(grads, optim.with_learning_rate(other.init(params), jnp.float32(0.01)), params)[0]
  first, _ = adam.update(grads["wte"]["embedding"], adam.init(params["wte"]["embedding"]))
  chex.assert_trees_all_close(u["wte"]["embedding"], first, rtol=1e-5, atol=1e-9)


def test_muons_momentum_warms_up_linearly_as_the_records_do():
  """`optim.muon_momentum_warmup_steps` = W: momentum (1 - f) * start + f * 0.95 with f = min(n / W, 1)
  at Muon's n-th update (from 0). Two steps of a hidden matrix equal optax's Muon at 0.85, then at
  0.85 + 0.1 / W, and differ from Muon at a constant 0.95."""
  oc = _optim_config(name="muon_groups", grad_clip=0.0, muon_momentum_warmup_steps=4, muon_momentum_start=0.85)
  momentum = optim.muon_momentum(oc)
  assert [float(momentum(n)) for n in (0, 2, 4, 8)] == pytest.approx([0.85, 0.9, 0.95, 0.95])
  assert optim.muon_momentum(_optim_config(name="muon_groups")) is None
  params = _gpt2_micro_params()
  p = params["h_0"]["mlp"]["c_fc"]["kernel"]

  def two_steps(tx):
    state = optim.with_learning_rate(tx.init(params), jnp.float32(0.02))
    for seed in (1, 2):
      updates, state = tx.update(_gpt2_micro_grads(params, seed), state, params)
    return updates["h_0"]["mlp"]["c_fc"]["kernel"]

  g = [_gpt2_micro_grads(params, seed)["h_0"]["mlp"]["c_fc"]["kernel"] for seed in (1, 2)]
  first = optax.contrib.muon(0.02, beta=0.85)
  _, s = first.update(g[0], first.init(p), p)
  want, _ = optax.contrib.muon(0.02, beta=0.875).update(g[1], s, p)
  got = two_steps(optim.make_optimizer(oc))
  # Newton-Schulz iterations amplify float32 rounding differences: agreement to 1e-6 of entries ~1e-2.
  chex.assert_trees_all_close(got, want, atol=1e-6)
  constant = two_steps(optim.make_optimizer(_optim_config(name="muon_groups", grad_clip=0.0)))
  assert float(jnp.max(jnp.abs(got - constant))) > 1e-4
  # Plain 'muon' warms up too.
  plain = optim.make_optimizer(_optim_config(name="muon", muon_momentum_warmup_steps=4))
  states = [
    n
    for n in jax.tree.leaves(plain.init(params), is_leaf=user_optimizer._is_inject_state)
    if user_optimizer._is_inject_state(n)
  ]
  assert [float(n.hyperparams["beta"]) for n in states if "beta" in n.hyperparams] == [pytest.approx(0.85)]


@pytest.mark.parametrize(
  "changes, message",
  [
    (
      {"muon_momentum_warmup_steps": 10},
      r"--config\.optim\.muon_momentum_warmup_steps \(10\) warms up Muon's momentum, but --config\.optim\.name='adamw'",
    ),
    (
      {"name": "muon_groups", "muon_momentum_warmup_steps": 21},
      r"--config\.optim\.muon_momentum_warmup_steps \(21\) is longer than the run \(--config\.trainer\.steps=20\)",
    ),
  ],
)
def test_a_momentum_warm_up_without_muon_or_past_the_run_is_refused(changes, message):
  from conftest import micro_config

  c = micro_config(steps=20)
  c.optim.update(changes)
  with pytest.raises(ValueError, match=message):
    preflight.validate(c)
  c.optim.muon_momentum_warmup_steps = 20
  c.optim.name = "muon"
  preflight.validate(c)


# --- the tuning knobs: the AdamW groups' LR ratios, Muon's momentum, the Adam groups' scale -----------


@functools.cache
def _gpt2_micro_params_untied():
  """The `tiny,micro` model with an untied head (`lm_head`): every group of `adamw_group_labels`."""
  from experiments.configs import gpt2_small
  from hybridjax.models import gpt2

  c = gpt2_small.get_config("tiny,micro")
  c.model.untied_head = True
  model = gpt2.GPT2(gpt2.GPT2Config(**c.model.to_dict()))
  return model.init(jax.random.PRNGKey(0), jnp.zeros((1, c.model.n_ctx), jnp.int32))["params"]


def _steps(tx, params, n=2, lr=0.01):
  """The updates of `n` steps of `tx` from its initial state (each step's gradient its own), as a list."""
  state = optim.with_learning_rate(tx.init(params), jnp.float32(lr))
  out = []
  for seed in range(1, n + 1):
    updates, state = tx.update(_gpt2_micro_grads(params, seed), state, params)
    out.append(updates)
  return out


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_adamw_lr_ratios_scale_the_embeddings_and_the_head_only(name):
  """`optim.adamw_embed_lr_ratio` = 0.5 and `adamw_head_lr_ratio` = 3: over two steps from the same
  state the embeddings (token and positions) move 0.5x and the untied head 3x as far as at 1.0, and
  every other leaf moves identically (weight decay, betas and clipping unchanged)."""
  params = _gpt2_micro_params_untied()
  base = _steps(optim.make_optimizer(_optim_config(name=name)), params)
  scaled = _steps(
    optim.make_optimizer(_optim_config(name=name, adamw_embed_lr_ratio=0.5, adamw_head_lr_ratio=3.0)), params
  )
  for b, s in zip(base, scaled):
    for table in ("wte", "wpe"):
      chex.assert_trees_all_close(s[table], jax.tree.map(lambda u: 0.5 * u, b[table]), rtol=1e-6, atol=1e-12)
    chex.assert_trees_all_close(s["lm_head"], jax.tree.map(lambda u: 3.0 * u, b["lm_head"]), rtol=1e-6, atol=1e-12)
    assert float(jnp.max(jnp.abs(b["lm_head"]))) > 0
    rest = lambda t: {k: v for k, v in t.items() if k not in ("wte", "wpe", "lm_head")}
    chex.assert_trees_all_equal(rest(s), rest(b))


@pytest.mark.slow  # a micro GPT-2's optimizer steps, compiled (the default suite's time)
def test_a_tied_head_is_in_the_embedding_group_of_the_adamw_ratios():
  """With the head tied to the token embedding, the embedding ratio moves the tied matrix, and the
  head ratio moves nothing (there is no head of its own)."""
  params = _gpt2_micro_params()
  assert "lm_head" not in params
  labels = optim.adamw_group_labels(params)
  assert labels["wte"]["embedding"] == labels["wpe"]["embedding"] == "embed"
  base = _steps(optim.make_optimizer(_optim_config()), params, n=1)[0]
  embed = _steps(optim.make_optimizer(_optim_config(adamw_embed_lr_ratio=2.0)), params, n=1)[0]
  chex.assert_trees_all_close(embed["wte"], jax.tree.map(lambda u: 2.0 * u, base["wte"]), rtol=1e-6, atol=1e-12)
  head = _steps(optim.make_optimizer(_optim_config(adamw_head_lr_ratio=2.0)), params, n=1)[0]
  chex.assert_trees_all_equal(head, base)


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_adamw_at_default_ratios_is_the_plain_optax_chain_bit_for_bit(name):
  """At the default ratios (1.0) the optimizer is today's: clipping then optax's AdamW (decay on the
  matrices) or Adam with an injected LR; the same state layout and, over two steps, the same bits."""
  b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.1
  if name == "adamw":
    inner = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
      learning_rate=0.0, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
    )
  else:
    inner = optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=b1, b2=b2, eps=eps)
  hand_built = optax.chain(optax.clip_by_global_norm(1.0), inner)
  params = _gpt2_micro_params_untied()
  tx = optim.make_optimizer(_optim_config(name=name))
  assert jax.tree.structure(tx.init(params)) == jax.tree.structure(hand_built.init(params))
  chex.assert_trees_all_equal(_steps(tx, params), _steps(hand_built, params))


_MATRICES = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)


@pytest.mark.parametrize(
  "name, optax_built",
  [
    ("nadamw", lambda: optax.nadamw(0.01, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=_MATRICES)),
    ("lion", lambda: optax.lion(0.01, b1=0.9, b2=0.99, weight_decay=0.1, mask=_MATRICES)),
    ("schedule_free_adamw", lambda: optax.contrib.schedule_free_adamw(0.01, b1=0.9, b2=0.95, weight_decay=0.0)),
  ],
)
def test_the_adamw_family_is_optaxs_with_its_decay_on_the_matrices_only(name, optax_built):
  """'nadamw', 'lion' and 'schedule_free_adamw' at their defaults (no clipping) are optax's, with the
  weight decay on the matrices (schedule-free's compared without decay: optax's masks none), and the
  rate injected: over two steps the same updates as optax's at that rate."""
  params = _gpt2_micro_params_untied()
  decay = {"weight_decay": 0.0} if name == "schedule_free_adamw" else {}
  tx = optim.make_optimizer(_optim_config(name=name, grad_clip=0.0, min_lr_ratio=1.0, **decay))
  want, state = [], optax_built().init(params)
  for seed in (1, 2):
    updates, state = optax_built().update(_gpt2_micro_grads(params, seed), state, params)
    want.append(updates)
  chex.assert_trees_all_close(_steps(tx, params), want, rtol=1e-6, atol=1e-9)


def test_a_schedule_free_run_is_evaluated_and_averaged_at_its_average():
  """Schedule-free AdamW's state is evaluated at `schedule_free_eval_params` (not at the point its
  gradients are taken), and the params' average takes that point in (after one step, whose weight is
  1, the average is that point); any other optimizer's state is evaluated at its params."""
  params = {"w": jnp.linspace(-1.0, 1.0, 9).reshape(3, 3), "b": jnp.ones((3,))}
  loss = lambda p, batch: (jnp.sum(jnp.square(p["w"] @ batch["x"] + p["b"])), {})
  schedule = optim.make_schedule(_optim_config(learning_rate=0.1, warmup_steps=0, min_lr_ratio=1.0), 10)
  for name, moved in (("schedule_free_adamw", True), ("adamw", False)):
    tx = optim.make_optimizer(_optim_config(name=name, min_lr_ratio=1.0))
    state = optim.init_train_state(params, tx, averaging_beta=0.5)
    for steps in (1, 2):
      state, _ = optim.train_step(state, {"x": jnp.ones((3,))}, schedule, loss_fn=loss, tx=tx)
      at = state.params
      if moved:
        at = optax.contrib.schedule_free_eval_params(state.opt_state[1].inner_state, state.params)
      chex.assert_trees_all_equal(optim.raw_params(state), at)
      assert moved == bool(jnp.any(state.params["w"] != at["w"]))
      if steps == 1:
        chex.assert_trees_all_close(optim.final_params(state), at, rtol=1e-6)


def test_a_schedule_free_state_trains_in_the_donating_step():
  """Schedule-free's state starts its average at the params and holds its b1 twice (its own and the injected
  hyperparameter): the train state gets its own copies, so the donating step (`loop.baseline`) runs, and
  every other optimizer's state is as `tx.init` gives it."""
  from hybridjax.loop import baseline

  params = {"w": jnp.linspace(-1.0, 1.0, 9).reshape(3, 3), "b": jnp.ones((3,))}
  loss = lambda p, batch: (jnp.sum(jnp.square(p["w"] @ batch["x"] + p["b"])), {})
  schedule = optim.make_schedule(_optim_config(learning_rate=0.1, warmup_steps=0, min_lr_ratio=1.0), 10)
  tx = optim.make_optimizer(_optim_config(name="schedule_free_adamw", min_lr_ratio=1.0))
  state = optim.init_train_state(params, tx, averaging_beta=0.5)
  step = baseline.make_train_step(loss, tx)
  for _ in range(2):
    state, _ = step(state, {"x": jnp.ones((3,))}, schedule)
  assert int(state.step) == 2 and bool(optim.all_finite(state.params))
  tx = optim.make_optimizer(_optim_config())
  chex.assert_trees_all_equal(optim.init_train_state(params, tx).opt_state, tx.init(params))


@pytest.mark.slow  # a micro GPT-2's optimizer steps, compiled (the default suite's time)
def test_muon_groups_at_its_default_knobs_is_built_as_before_they_existed():
  """`optim.muon_momentum` = 0.95 and `groups_lr_scale` = 1.0 (the defaults) take today's path: no
  momentum is injected, and the updates are those of a block without the fields (written before
  them), bit for bit; the hidden matrix's update is optax's Muon at its default momentum."""
  params = _gpt2_micro_params()
  default = _optim_config(name="muon_groups", grad_clip=0.0)
  old = _optim_config(name="muon_groups", grad_clip=0.0)
  with old.unlocked():
    del old["muon_momentum"], old["groups_lr_scale"], old["muon_weight_decay"]
  tx = optim.make_optimizer(default)
  state = tx.init(params)
  injected = [
    n for n in jax.tree.leaves(state, is_leaf=user_optimizer._is_inject_state) if user_optimizer._is_inject_state(n)
  ]
  assert not any("beta" in n.hyperparams for n in injected)
  # The fused matrix's Muon has no weight decay injected at 0 (the state's earlier layout).
  assert set(state.inner_states["muon_qkv"].inner_state.hyperparams) == {"learning_rate"}
  got = _steps(tx, params)
  chex.assert_trees_all_equal(got, _steps(optim.make_optimizer(old), params))
  p = params["h_0"]["mlp"]["c_fc"]["kernel"]
  muon = optax.contrib.muon(0.01)
  s = muon.init(p)
  for seed, updates in zip((1, 2), got):
    want, s = muon.update(_gpt2_micro_grads(params, seed)["h_0"]["mlp"]["c_fc"]["kernel"], s, p)
    chex.assert_trees_all_close(updates["h_0"]["mlp"]["c_fc"]["kernel"], want, atol=1e-6)


@pytest.mark.slow  # a micro GPT-2's optimizer steps, compiled (the default suite's time)
@pytest.mark.parametrize("name", ["muon", "muon_groups"])
def test_muon_momentum_sets_muons_momentum_and_where_its_warm_up_ends(name):
  """`optim.muon_momentum` = 0.9: two steps of a hidden matrix are optax's Muon at beta 0.9 (not at
  0.95); with a warm-up of W updates the momentum rises from the start to 0.9 at W and stays."""
  params = _gpt2_micro_params()
  path = ("h_0", "mlp", "c_fc", "kernel")
  leaf = lambda t: t[path[0]][path[1]][path[2]][path[3]]
  got = _steps(optim.make_optimizer(_optim_config(name=name, grad_clip=0.0, muon_momentum=0.9)), params)
  default = _steps(optim.make_optimizer(_optim_config(name=name, grad_clip=0.0)), params)
  p = leaf(params)
  muon = optax.contrib.muon(0.01, beta=0.9)
  s = muon.init(p)
  for seed, updates in zip((1, 2), got):
    want, s = muon.update(leaf(_gpt2_micro_grads(params, seed)), s, p)
    chex.assert_trees_all_close(leaf(updates), want, atol=1e-6)
  assert float(jnp.max(jnp.abs(leaf(got[1]) - leaf(default[1])))) > 1e-4
  warm = optim.muon_momentum(_optim_config(name=name, muon_momentum=0.9, muon_momentum_warmup_steps=4))
  assert [float(warm(n)) for n in (0, 2, 4, 8)] == pytest.approx([0.85, 0.875, 0.9, 0.9])


@pytest.mark.slow  # a micro GPT-2's optimizer steps, compiled (the default suite's time)
@pytest.mark.parametrize("warmup", [0, 2])
def test_muon_weight_decay_decays_muon_groups_matrices_as_optax_muon_does(warmup):
  """`optim.muon_weight_decay` = 0.1 under 'muon_groups': two steps of a hidden matrix are optax's Muon
  with that decoupled weight decay, the fused query-key-value matrix's are the same Muon on its three
  (d, d) blocks, with a constant momentum or a warm-up, and the Adam groups' updates are unchanged."""
  params = _gpt2_micro_params()
  base = dict(name="muon_groups", grad_clip=0.0, muon_momentum_warmup_steps=warmup)
  got = _steps(optim.make_optimizer(_optim_config(**base, muon_weight_decay=0.1)), params)
  plain = _steps(optim.make_optimizer(_optim_config(**base)), params)
  momentum = optim.muon_momentum(_optim_config(**base))  # a constant, or a warm-up's function of the update count
  beta = lambda n: momentum if momentum is None or not callable(momentum) else float(momentum(n))
  leaf = lambda t, *path: functools.reduce(lambda x, k: x[k], path, t)
  fc, qkv = ("h_0", "mlp", "c_fc", "kernel"), ("h_0", "attn", "c_attn", "kernel")
  dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2)
  for path in (fc, qkv):
    p = leaf(params, *path)
    d = p.shape[0]
    to = (lambda x: x.reshape(d, 3, d).transpose(1, 0, 2)) if path == qkv else (lambda x: x)
    numbers = (lambda t: jax.tree.map(lambda _: dims, t)) if path == qkv else None
    muon = lambda n: optax.contrib.muon(  # noqa: B023 (used within this iteration)
      0.01, weight_decay=0.1, muon_weight_dimension_numbers=numbers, **({} if beta(n) is None else {"beta": beta(n)})
    )
    s = muon(0).init(to(p))
    for n, updates in enumerate(got):
      want, s = muon(n).update(to(leaf(_gpt2_micro_grads(params, n + 1), *path)), s, to(p))
      chex.assert_trees_all_close(to(leaf(updates, *path)), want, atol=1e-6)
    assert float(jnp.max(jnp.abs(leaf(got[1], *path) - leaf(plain[1], *path)))) > 1e-5, path
  for group in ("wte", "wpe"):
    chex.assert_trees_all_equal(got[1][group], plain[1][group])


@pytest.mark.slow  # a micro GPT-2's optimizer steps, compiled (the default suite's time)
def test_groups_lr_scale_multiplies_every_adam_group_of_muon_groups():
  """`optim.groups_lr_scale` = 2: the embeddings', the head's (untied or tied, at its own settings)
  and the scalars' updates double; Muon's are the same bits."""
  for params, tied in ((_gpt2_micro_params_untied(), {}), (_gpt2_micro_params(), {"tied_lr_ratio": 0.36})):
    oc = dict(name="muon_groups", grad_clip=0.0, **tied)
    labels = optim.muon_group_labels(params, tied_label="tied_head" if tied else "head")
    base = _steps(optim.make_optimizer(_optim_config(**oc)), params, n=1)
    scaled = _steps(optim.make_optimizer(_optim_config(groups_lr_scale=2.0, **oc)), params, n=1)
    for b, s in zip(base, scaled):
      for x, y, label in zip(jax.tree.leaves(b), jax.tree.leaves(s), jax.tree.leaves(labels)):
        if label.startswith("muon"):
          chex.assert_trees_all_equal(y, x)
        else:
          chex.assert_trees_all_close(y, 2.0 * x, rtol=1e-6, atol=1e-12)
    assert {"embed", "scalar"} <= set(jax.tree.leaves(labels)) and ({"tied_head"} if tied else {"head"}) <= set(
      jax.tree.leaves(labels)
    )


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"adamw_embed_lr_ratio": 0.0}, r"--config\.optim\.adamw_embed_lr_ratio must be > 0\.0, got 0\.0"),
    ({"adamw_head_lr_ratio": -1.0}, r"--config\.optim\.adamw_head_lr_ratio must be > 0\.0, got -1\.0"),
    (
      {"name": "muon", "adamw_embed_lr_ratio": 2.0},
      r"--config\.optim\.adamw_embed_lr_ratio=2\.0 applies only to an optimizer that declares it \('adamw', "
      r"'adam', 'nadamw', 'lion'\), not 'muon' \(.*\): set it back to 1\.0",
    ),
    (
      {"name": "schedule_free_adamw", "min_lr_ratio": 1.0, "adamw_embed_lr_ratio": 2.0},
      r"not 'schedule_free_adamw' \(.*no per-group LR ratio, since its averaging weights depend on the LR\): set it "
      r"back to 1\.0",
    ),
    (
      {"name": "schedule_free_adamw", "min_lr_ratio": 0.1},
      r"--config\.optim\.min_lr_ratio=0\.1 decays the rate, but --config\.optim\.name='schedule_free_adamw' owns "
      r"its schedule .*: set --config\.optim\.min_lr_ratio=1\.0",
    ),
    (
      {"name": "sgd", "adamw_embed_lr_ratio": 2.0, "adamw_head_lr_ratio": 0.5},
      r"--config\.optim\.adamw_embed_lr_ratio=2\.0 and --config\.optim\.adamw_head_lr_ratio=0\.5 apply only to "
      r"an optimizer that declares them \(.*\), not 'sgd' \(.*\): set them back to 1\.0",
    ),
    ({"name": "muon", "muon_momentum": 1.0}, r"--config\.optim\.muon_momentum must be < 1\.0, got 1\.0"),
    ({"name": "muon", "muon_momentum": 0.0}, r"--config\.optim\.muon_momentum must be > 0\.0, got 0\.0"),
    (
      {"muon_momentum": 0.9},
      r"--config\.optim\.muon_momentum \(0\.9\) is Muon's momentum, but --config\.optim\.name='adamw' has no Muon",
    ),
    (
      {"name": "muon_groups", "muon_momentum": 0.8, "muon_momentum_warmup_steps": 10},
      r"--config\.optim\.muon_momentum_start \(0\.85\) is above --config\.optim\.muon_momentum \(0\.8\)",
    ),
    ({"name": "muon_groups", "groups_lr_scale": 0.0}, r"--config\.optim\.groups_lr_scale must be > 0\.0, got 0\.0"),
    (
      {"name": "muon", "groups_lr_scale": 2.0},
      r"--config\.optim\.groups_lr_scale \(2\.0\) scales the Adam groups of 'muon_groups', but "
      r"--config\.optim\.name='muon'",
    ),
    (
      {"warmup_steps": 20},
      r"--config\.optim\.warmup_steps \(20\) is at least the run's length \(--config\.trainer\.steps=20\): the "
      r"learning rate would never reach its peak --config\.optim\.learning_rate nor decay; set "
      r"--config\.optim\.warmup_steps below 20 \(e\.g\. 2\), or 0 for no warm-up",
    ),
  ],
)
def test_the_tuning_knobs_bad_values_are_refused_naming_the_field(changes, message):
  from conftest import micro_config

  c = micro_config(steps=20)
  preflight.validate(c)
  c.optim.update(changes)
  with pytest.raises(ValueError, match=message):
    preflight.validate(c)


def test_the_tuning_knobs_valid_values_pass_and_an_unused_start_is_not_checked():
  from conftest import micro_config

  c = micro_config(steps=20)
  for changes in (
    {"name": "adam", "adamw_embed_lr_ratio": 0.3, "adamw_head_lr_ratio": 4.0},
    {"name": "muon", "muon_momentum": 0.98, "muon_momentum_warmup_steps": 10},
    # Without a warm-up the start is unused: a momentum below it is no error.
    {"name": "muon_groups", "muon_momentum": 0.8, "groups_lr_scale": 0.5},
    {"warmup_steps": 19},
    {"warmup_steps": 0},
  ):
    d = micro_config(steps=20)
    d.optim.update(changes)
    preflight.validate(d)
  c.trainer.steps = 1
  c.optim.warmup_steps = 1
  with pytest.raises(ValueError, match=r"set --config\.optim\.warmup_steps to 0$"):
    preflight.validate(c)


def test_the_default_warm_up_on_a_short_run_is_refused():
  """`trainer.steps` = 20 with the default warm-up (50): the clear error (the command line's is in
  tests/test_cli.py)."""
  c = config_lib.default_config()
  c.trainer.steps = 20
  with pytest.raises(ValueError, match=r"--config\.optim\.warmup_steps \(50\) is at least the run's length"):
    preflight.validate(c)


def test_adamw_ratios_with_another_optimizer_are_refused_by_make_optimizer_too():
  with pytest.raises(
    ValueError, match=r"--config\.optim\.adamw_head_lr_ratio=2\.0 applies only to .* not 'muon_groups'"
  ):
    optim.make_optimizer(_optim_config(name="muon_groups", adamw_head_lr_ratio=2.0))


def test_muon_train_step_learns():
  oc = _optim_config(name="muon", learning_rate=2e-2, warmup_steps=0, schedule="wsd")
  tx = optim.make_optimizer(oc)
  step = _jitted_step(tx)
  schedule = optim.make_schedule(oc, 200)
  state = optim.init_train_state(_params(), tx)
  losses = []
  for i in range(60):
    state, m = step(state, _batch(i), schedule)
    losses.append(float(m["loss"]))
  assert int(state.nonfinite_total) == 0
  assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize(
  "field,value",
  [
    ("optim.name", ""),  # any other name may name a user optimizer (tests/test_byo.py)
    ("optim.schedule", "linear"),
    ("optim.decay_fraction", 0.0),
    ("optim.decay_fraction", 1.5),
    ("optim.adam_lr_ratio", 0.0),
    ("optim.muon_weight_decay", -0.1),
    ("optim.tied_lr_ratio", 0.0),
    ("optim.tied_b1", 1.0),
    ("optim.tied_eps", 0.0),
    ("optim.muon_momentum_warmup_steps", -1),
    ("optim.muon_momentum_start", 1.0),
  ],
)
def test_optim_config_errors_name_the_field(field, value):
  from conftest import micro_config

  c = micro_config()
  preflight.validate(c)
  leaf = field.split(".")[1]
  with c.unlocked():
    if type(c.optim[leaf]) is not type(value):
      del c.optim[leaf]
    c.optim[leaf] = value
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    preflight.validate(c)


def test_muon_and_wsd_configs_are_valid():
  from conftest import micro_config

  c = micro_config()
  c.optim.update(name="muon", schedule="wsd", decay_fraction=1.0, adam_lr_ratio=1.0, muon_weight_decay=0.1)
  preflight.validate(c)


def test_per_example_losses_average_to_the_batch_loss():
  from conftest import micro_config

  from experiments import gpt2_small

  task = gpt2_small.build_task(micro_config())
  params = task.init_params(jax.random.PRNGKey(0))
  batch = task.train_batch(0)
  losses = jax.jit(lambda p, b: optim.per_example_losses(task.loss_fn, p, b))(params, batch)
  chex.assert_shape(losses, (batch["inputs"].shape[0],))
  # Equal-length sequences: the batch's mean token loss is the mean of the sequences' own.
  chex.assert_trees_all_close(jnp.mean(losses), task.loss_fn(params, batch)[0], rtol=1e-5)
  assert float(jnp.std(losses)) > 0  # each sequence its own loss
  first = task.loss_fn(params, jax.tree.map(lambda x: x[:1], batch))[0]
  chex.assert_trees_all_close(losses[0], first, rtol=1e-5)
