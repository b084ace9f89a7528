"""Variant sets of the speedrun recipe: named before/after pairs on the same seeds, so that one
change is all that differs between the two sides.

A `Pair` starts from a cumulative row of the recipe (`bench.speedrun.TRICKS` through `row`, as the
recipe trains it), leaves the tricks `drop` out of its before side, and sets `before` on one side and
`after` on the other ({dotted field: value}; {}: the row as the recipe runs it). Its figure is
loss(after) - loss(before): negative where the change lowers the loss.

A set is run at fixed LRs (each side at the LR the recipe tuned for its row: a change's effect at
that LR) or tuned (each side its own LR sweep on the tuning seeds, centred on its row's tuned LR, as
every step of the recipe is: a change's effect with both sides tuned alike).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridjax.bench.speedrun import TRICKS
from hybridjax.bench.studies import Record


@dataclasses.dataclass(frozen=True)
class Pair:
  """One change measured on one row of the recipe."""

  name: str
  row: str  # the recipe's cumulative step both sides start from
  what: str  # the change, from before to after
  before: Record
  after: Record = dataclasses.field(default_factory=dict)
  drop: tuple[str, ...] = ()  # tricks of the row the before side leaves out
  rule: str = ""  # what else goes with the change, where one trick needs another
  before_lr_row: str = ""  # the row whose tuned LR centres the before side's sweep ('': `row`)

  def fields(self, side: str, config: Any) -> Record:
    """The fields `side` sets, a function's value read from `config` (the preset's, before any trick)."""
    return {k: (v(config) if callable(v) else v) for k, v in getattr(self, side).items()}

  def dropped(self, side: str) -> tuple[str, ...]:
    """The tricks of the row `side` leaves out."""
    return self.drop if side == "before" else ()

  def lr_row(self, side: str) -> str:
    """The row whose tuned settings `side` starts from."""
    return (self.before_lr_row or self.row) if side == "before" else self.row


@dataclasses.dataclass(frozen=True)
class VariantSet:
  """A named list of pairs, and how its sides get their LRs."""

  pairs: tuple[Pair, ...]
  tuned: bool  # each side its own LR sweep (else the row's tuned LR)


# Each fidelity fix and missing piece of the recipe, measured where it enters, against the behaviour
# the recipe had before it (its first trick list); and ReLU² under both initialisations, which tells
# an initialisation fault from an effect of the small width.
FIXES = (
  Pair("init", "muon", "the records' init U(±1/√fan_in), for GPT-2's N(0, 0.02)", {"model.init": "gpt2"}),
  Pair(
    "tied_head",
    "muon",
    "the tied matrix at the records' 0.36 of Muon's rate, betas (0.9, 0.95), eps 1e-8, for the head group's "
    "0.16, (0.8, 0.95), 1e-10",
    {"optim.tied_lr_ratio": 0.16, "optim.tied_b1": 0.8, "optim.tied_b2": 0.95, "optim.tied_eps": 1e-10},
  ),
  Pair(
    "lr_warmup",
    "muon",
    "no LR warm-up, for the preset's (50 steps at long)",
    {"optim.warmup_steps": lambda c: int(c.optim.warmup_steps)},
  ),
  Pair("embed_norm", "modern_arch", "no embedding norm at #5 (it comes with #8), for one", {"model.embed_norm": True}),
  Pair("value_residual", "shortcuts", "the value residual (#9), for none", {"model.value_residual": False}),
  Pair(
    "momentum_warmup",
    "shortcuts",
    "Muon's momentum warmed up from 0.85, for 0.95 throughout",
    {"optim.muon_momentum_warmup_steps": 0},
  ),
  Pair(
    "attn_scale", "attn_scale", "the records' score bound 15.36/head_dim, for 1/√head_dim", {"model.attn_scale": 0.0}
  ),
  Pair("init_0.5", "attn_scale", "#20's init 0.5/√fan_in, for U(±1/√fan_in)", {"model.init": "fan_in"}),
  Pair("relu2", "attn_scale", "ReLU², for GELU (the records' init)", {"model.relu2": False}),
  Pair(
    "relu2_gpt2_init",
    "attn_scale",
    "ReLU², for GELU, under GPT-2's init",
    {"model.relu2": False, "model.init": "gpt2"},
    {"model.init": "gpt2"},
  ),
)


def leave_one_out(tricks: list[str]) -> tuple[Pair, ...]:
  """The whole recipe against the recipe without one of its tricks, for each trick (#5's group
  split into its three changes): what each adds in the company of all the others."""
  last, pairs = tricks[-1], []
  for name in tricks:
    if name == "modern_arch":
      for field, what in (("relu2", "ReLU²"), ("qk_norm", "QK-norm"), ("zero_init_proj", "zero-init projections")):
        pairs.append(Pair(field, last, f"{what} (#5), with every other trick", {f"model.{field}": False}))
    elif name == "muon":
      pairs.append(
        Pair(
          "muon",
          last,
          "Muon with its Adam groups (#3-#4), with every other trick",
          {"optim.muon_momentum_warmup_steps": 0},
          drop=("muon",),
          rule="without Muon go its groups' ratios, the tied head's settings, its momentum warm-up and its "
          "dropped clipping, weight decay and LR warm-up: the variant is AdamW as the anchor runs it, its "
          "sweep centred on the last AdamW row's LR",
          before_lr_row=tricks[tricks.index("muon") - 1],
        )
      )
    else:
      rule = "without the value embeddings, the value residual they replaced (#9) is back" * (name == "value_embeds")
      pairs.append(Pair(name, last, f"{name}, with every other trick", {}, drop=(name,), rule=rule))
  return tuple(pairs)


SETS: dict[str, VariantSet] = {
  "fixes": VariantSet(FIXES, tuned=False),
  "leave_one_out": VariantSet(leave_one_out(list(TRICKS)), tuned=True),
}
