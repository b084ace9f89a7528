"""hybridjax: train Flax models with fewer backward passes.

Training alternates real optimizer steps with predicted steps, theta += sum_g alpha_g velocity_g,
planned by an online-trained RSSM of the training trajectory. Start with `hybridjax.steps`
(`make_context`, `init_hybrid_state`, `hybrid_step`) or the experiment in
`experiments/gpt2_small.py`.
"""

__version__ = "0.1.0"
