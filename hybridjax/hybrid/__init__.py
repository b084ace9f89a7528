"""Hybrid training, the framework: the generic controller and its phases, the state, the context, the
real step every method shares, the parameter groups and the trajectory buffers, and the switch step
that selects a method's three transitions (`full_step`, `predict_step`, `correct_step`) on the device
(`step`). The methods themselves live in `hybridjax.methods`.

Nothing here imports the host loop, a method or any infrastructure: only `hybridjax.optim`, jax,
flax, optax, chex and numpy.
"""
