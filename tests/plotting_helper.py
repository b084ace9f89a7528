"""Shared by tests/test_plotting.py and tests/test_notebook.py: the tiny run, and PNG checks.

test_notebook has the notebook train the tiny hybrid and baseline runs; test_plotting reuses them
when the notebook test ran first in the same process, and otherwise trains them itself with the same
config. Both build the same step programs, so with their shared persistent compilation cache the
second to compile loads the programs instead.
"""

from __future__ import annotations

import numpy as np
from matplotlib import image as mpimg

from hybridjax import plotting

# Dotted overrides of the `tiny` preset (as the notebook's HYBRIDJAX_NOTEBOOK_OVERRIDES takes them):
# the model of conftest.micro_config, a small RSSM, short WARMUP/FULL and confidence threshold 0 so
# that a 60-step run goes through every phase.
TINY_OVERRIDES = {
  "model.n_layer": 1,
  "model.d_model": 32,
  "model.n_head": 2,
  "model.n_ctx": 32,
  "trainer.batch_size": 4,
  "trainer.eval_batches": 2,
  "trainer.checkpoint_every": 0,
  "optim.warmup_steps": 5,
  "hybrid.warmup_steps": 10,
  "hybrid.full_steps": 5,
  "hybrid.confidence_threshold": 0.0,
  "hybrid.velocity.rssm.deter": 32,
  "hybrid.velocity.rssm.latent": 8,
  "hybrid.velocity.rssm.hidden": 32,
  "hybrid.velocity.rssm.ensemble": 2,
  "hybrid.velocity.history_size": 16,
  "hybrid.velocity.window": 8,
}
TINY_STEPS = 60
# mode -> workdir of the runs the notebook test made in this process (the same config as
# `tiny_config`): the plotting tests reuse them instead of training the same runs again.
NOTEBOOK_RUNS: dict[str, str] = {}


def tiny_config(mode: str, compile_cache_dir: str = ""):
  """The tiny preset with TINY_OVERRIDES, as the notebook builds it (log every 10, eval every 50)."""
  from experiments.configs import gpt2_small

  c = gpt2_small.get_config("tiny")
  c.mode = mode
  c.trainer.steps = TINY_STEPS
  c.trainer.log_every = 10
  c.trainer.eval_every = 50
  c.trainer.progress = False
  # The baseline reads no hybrid setting (and `train` refuses one set): those are the hybrid run's.
  c.update_from_flattened_dict({k: v for k, v in TINY_OVERRIDES.items() if mode == "hybrid" or k[:7] != "hybrid."})
  c.trainer.compile_cache = bool(compile_cache_dir)
  c.trainer.compile_cache_dir = compile_cache_dir
  return c


def distinct_colors(path: str) -> int:
  """Number of distinct RGB colours in a PNG (quantised to 8 bits)."""
  img = mpimg.imread(path)[..., :3]
  return len(np.unique((img.reshape(-1, 3) * 255).round().astype(np.uint8), axis=0))


def has_band(path: str, phase: str, tol: int = 4, min_pixels: int = 500) -> bool:
  """Whether the PNG has an area (not a few stray pixels) of `phase`'s band colour over white."""
  img = (mpimg.imread(path)[..., :3] * 255).round().astype(int)
  hex_color = plotting.PHASE_COLORS[phase]
  rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
  band = plotting.BAND_ALPHA * rgb + (1 - plotting.BAND_ALPHA) * 255
  return int(np.sum(np.all(np.abs(img - band) <= tol, axis=-1))) >= min_pixels
