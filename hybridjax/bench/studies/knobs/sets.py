"""The knobs each side of the tuning comparison searches, as data: the R4 anchor's (AdamW) and the
recipe's (its Muon row and the whole recipe), each side the same number of settings to try, so that
both sides get the same tuning budget (14 settings, each on both tuning seeds). `SETS` names the
searches `benchmark.knobs.set` chooses from: 'full' (these) and 'quick' (two knobs of two values a
side, the quick preset's run of the study's code path)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridjax.bench.studies import Record


@dataclasses.dataclass(frozen=True)
class Knob:
  """One knob: the values the coordinate search tries besides the side's current one."""

  name: str
  values: tuple[Any, ...]
  fields: tuple[str, ...]  # the dotted fields a value sets (all of them to the value)
  also: Record = dataclasses.field(default_factory=dict)  # fields any of its values needs
  per_step: bool = False  # its values are fractions of the run's N steps (a warm-up)

  def values_at(self, steps: int) -> tuple[Any, ...]:
    """Its values for a run of `steps` steps."""
    return tuple(max(1, round(v * steps)) if v else v for v in self.values) if self.per_step else self.values

  def changes(self, value: Any) -> Record:
    return {f: value for f in self.fields} | self.also


ANCHOR = (
  Knob("b1", (0.8, 0.95), ("optim.b1",)),
  Knob("b2", (0.99, 0.9), ("optim.b2",)),
  Knob("warmup", (0, 0.05), ("optim.warmup_steps",), per_step=True),  # 0 and 150 steps at long
  Knob("floor", (0.0, 0.3), ("optim.min_lr_ratio",)),
  Knob("embed_head_lr_ratio", (0.5, 2.0), ("optim.adamw_embed_lr_ratio", "optim.adamw_head_lr_ratio")),
  Knob("init", ("fan_in", "fan_in_0.5"), ("model.init",)),
  # The published wsd family's schedule, its cool-down fraction tuned.
  Knob("wsd_cooldown", (0.2, 0.4), ("optim.decay_fraction",), {"optim.schedule": "wsd"}),
)
RECIPE = (
  Knob("muon_momentum", (0.85, 0.9, 0.98), ("optim.muon_momentum",)),
  Knob("groups_lr_scale", (0.5, 0.7, 1.4, 2.0), ("optim.groups_lr_scale",)),
  Knob("warmup", (1 / 120, 0.025, 0.05), ("optim.warmup_steps",), per_step=True),  # 25, 75, 150 at long
  Knob("cooldown", (0.2, 0.3, 0.5, 0.6), ("optim.decay_fraction",)),
)
SIDES = {"anchor": ANCHOR, "muon": RECIPE, "recipe": RECIPE}  # side -> its knobs, searched in this order
QUICK = {
  "anchor": (ANCHOR[0], ANCHOR[1]),
  "muon": (
    Knob("muon_momentum", (0.85, 0.9), ("optim.muon_momentum",)),
    Knob("groups_lr_scale", (0.5, 2.0), ("optim.groups_lr_scale",)),
  ),
}
QUICK["recipe"] = QUICK["muon"]
SETS = {"full": SIDES, "quick": QUICK}  # benchmark.knobs.set -> {side: its knobs}
