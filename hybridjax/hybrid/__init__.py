"""Hybrid training, the pure algorithm: three transitions (`full_step`, `predict_step`,
`correct_step`) over one `HybridState`, selected on the device by the controller (`step`).

Nothing here imports the host loop or any infrastructure: only `hybridjax.optim`, jax, flax,
optax, chex and numpy.
"""
