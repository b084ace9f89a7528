"""hybridjax: train Flax models with fewer backward passes.

Training alternates real optimizer steps with predicted steps, theta += sum_g alpha_g velocity_g,
planned by an online-trained RSSM of the training trajectory. The layers, each importing only those
below it:

  hybridjax.optim     the optimizer layer: TrainState, the runtime LR schedule, the baseline step
  hybridjax.hybrid    the pure algorithm: full_step, predict_step, correct_step, the fused hybrid_step
  hybridjax.loop      the host loop: drivers (baseline, hybrid) and train()

The experiment is `experiments/gpt2_small.py`; the algorithm is described in docs/design.md.
"""

__version__ = "0.1.0"
