"""Cautious AdamW (Liang et al. 2024, "Cautious optimizers"): AdamW's update zeroed where its sign
disagrees with the gradient's, the rest rescaled by the share kept; weight decay decoupled, on matrices."""

import jax
import jax.numpy as jnp
import optax

CONFIG = {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
SPACE = {
  "learning_rate": {"min": 1e-3, "max": 3e-2, "scaling": "log"},
  "b1": {"feasible_points": [0.8, 0.9, 0.95]},
  "weight_decay": {"min": 0.01, "max": 1.0, "scaling": "log"},
}


def caution(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner`'s update where it agrees in sign with the gradient, rescaled by the share that does."""

  def update(grads, state, params=None):
    updates, state = inner.update(grads, state, params)

    def masked(u, g):
      agree = (u * g > 0).astype(u.dtype)
      return u * agree / jnp.maximum(agree.mean(), 1e-3)

    return jax.tree.map(masked, updates, grads), state

  return optax.GradientTransformation(inner.init, update)


def optimizer(learning_rate, labels, b1, b2, eps, weight_decay):
  matrices = lambda params: jax.tree.map(lambda group: group != "vector", labels(params))  # noqa: E731
  return optax.chain(
    caution(optax.scale_by_adam(b1=b1, b2=b2, eps=eps)),
    optax.add_decayed_weights(weight_decay, matrices),
    optax.scale_by_learning_rate(learning_rate),
  )
