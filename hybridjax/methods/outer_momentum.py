"""Outer momentum (`hybrid.method='outer_momentum'` with `optim.outer_every` > 0): real steps only.

Outer Nesterov momentum on K-step displacements lives in the optimizer layer (`optim.OuterMomentum`,
in the train state), so it runs in the baseline loop too (`--config.mode=baseline`), which is how the
benchmark runs it. As a method it is the hybrid loop's real step and nothing more (the default
`full_step`, the baseline's): it never predicts. Other methods compose with it by declaring it in
their `COMPOSES_WITH` (the jump then follows its m).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections

from hybridjax.hybrid import groups as groups_lib
from hybridjax.hybrid.context import HybridContext

NAME = "outer_momentum"
# No block of its own: its settings are `optim.outer_every`, `optim.outer_eta` and `optim.outer_mu`.
# Its control arm is the baseline itself (no CONTROL).


def check(config: ml_collections.ConfigDict) -> list[str]:
  if config.get("optim", {}).get("outer_every"):
    return []
  return [
    "--config.hybrid.method='outer_momentum' needs --config.optim.outer_every > 0 (real steps between outer "
    "steps, e.g. 100)"
  ]


def make_settings(hybrid: ml_collections.ConfigDict, *, groups: groups_lib.ParamGroups) -> None:
  del hybrid, groups
  return None


def control(hybrid: ml_collections.ConfigDict, settings: None) -> dict[str, Any]:
  del hybrid, settings
  return {"enable_predict": False}


def init(ctx: HybridContext, params: Any, rng: jax.Array) -> None:
  del ctx, params, rng
  return None  # its state is the train state's `outer`
