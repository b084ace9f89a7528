"""The joint search (`benchmark.tuner='joint'`): one procedure for every side of a comparison, over the
side's space of knobs (`space_of`: `SPACES` names the spaces), every run N steps on the search seeds.

1. `configs` points of a scrambled Sobol sequence (scipy's, its seed recorded) over the space, and the
   side's published setting, each on the first two search seeds;
2. the `FINALISTS` best by two-seed mean on the third seed, the best by three-seed mean kept;
3. `finish`: (LR, weight decay) refined together (`refine`: the LR's line search, then the weight decay's
   x/÷ 2, once more if either moved); each ordered knob at an edge of its range bracketed (`bracket`); the
   chosen combination run as chosen on the three seeds, and where a knob moved since the LR was fitted, the
   refinement and that run once more;
4. the setting for the raw iterate: the lowest raw three-seed mean among the settings run on all three
   seeds, through step 3 read raw (counted as tuning, both sides alike).

A line search or a bracketing runs a value's neighbours on the three seeds and moves on past the best only
while it wins by more than the noise of the difference (`tuning.wins_beyond_noise`), at most `LR_MOVES`
steps. A setting's mean is read at its best iterate: the raw one or the averaged one at one of
`AVERAGING_BETAS`, the same for all its seeds. A stalled run (the plateau rule, `figures.plateau_runs`,
among the setting's own seeds) is re-run once on the spare seed and not ranked. `equalise` then gives the
side that spent less the difference, in N-run equivalents (every run's steps over N), as further Sobol
points on the first two seeds; one that beats the kept winner's two-seed mean goes through step 3 within
what is left. Each side's tuning-cost curve (its best two-seed mean against runs spent) is kept; where the
last quarter of some side's budget improved its best by more than one standard error of a two-seed mean
(`saturation`), both sides get the same further budget (`FURTHER`), spent as `equalise` spends.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import statistics
import warnings
from typing import Any

import numpy as np

from hybridjax import config as config_lib
from hybridjax import optim as optim_lib
from hybridjax import preflight
from hybridjax.bench import specs, tuning
from hybridjax.bench.figures import plateau_runs
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import Config, Record
from hybridjax.optimizers import module as module_lib

AVERAGING_BETAS = (0.98, 0.99, 0.995, 0.998, 0.999)
"""The averaging betas every search run records; a setting is read at the best of them (or raw)."""
FINALISTS = 4  # the settings of step 1 that go on to the third seed
LR_MOVES = 4  # the most steps a line search or a knob's bracketing takes past where it started
SOBOL_POINTS = 2**8  # the Sobol block drawn (a power of 2, its balance): the first `configs`, then the extras
FURTHER = 0.25  # an unsaturated search's further budget, as a share of the larger side's total
# The spaces (`space_of`), each with the asymmetry between an AdamW side and a Muon side that it leaves.
SPACES = {
  "v1": "AdamW's embedding LR ratio takes three values {0.5, 1, 2} where a tied Muon row's is continuous "
  "x/÷ 4; a Muon row with an untied head is refused",
  "symmetric": "every side's embedding and head LR ratios continuous over x/÷ 4 (AdamW's adamw_* ratios, a "
  "tied Muon row's tied_lr_ratio, an untied one's embed_lr_ratio and head_lr_ratio); left: a Muon row's "
  "Adam groups have betas of their own (tied_b1/b2, or groups_b1/b2), as AdamW's betas are its own, since "
  "they are that row's only Adam, and scalar_lr_ratio is searched on an untied Muon row alone (AdamW's "
  "scalars train at its LR)",
}


def weight_decay_field(config: Config) -> str | None:
  """The weight decay `config`'s optimizer reads, which `refine` moves with the LR: the one field its
  declaration gives the role 'weight decay' (`optimizers.OPTIMIZERS`), a user's module's `weight_decay`
  knob (`optimizers.module`); None where it has none (or, as 'muon', two)."""
  name = str(config.optim.name)
  if name not in optim_lib.OPTIMIZERS:
    block = config.optim.get(module_lib.BLOCK, {})
    return f"optim.{module_lib.BLOCK}.weight_decay" if "weight_decay" in block else None
  fields = [f.name for f in optim_lib.OPTIMIZERS[name].fields if "weight decay" in f.roles]
  return f"optim.{fields[0]}" if len(fields) == 1 else None


def weight_decay_of(config: Config) -> tuple[str | None, float]:
  """(`weight_decay_field` of `config`, its value; 0.0 where there is none)."""
  field = weight_decay_field(config)
  return field, 0.0 if field is None else float(config_lib.flatten(config)[field])


@dataclasses.dataclass(frozen=True)
class Knob:
  """One dimension of a side's space: the config field it sets (dotted) and its values.

  kind 'choice': one of the ordered `values`; 'category': one of `values`, unordered (no edge to step
  past); 'log': log-uniform in [values[0], values[1]] (of 1 - the value when `one_minus`, as for Adam's
  beta2); 'linear': uniform in it; 'zero_or_log': 0 half the time, else log-uniform in the range.
  `below` / `above`: the further steps past the range's low / high end, in order (of 1 - the value when
  `one_minus`; at most `LR_MOVES`); the last is the knob's hard edge, and where there are none the range's
  end is (a domain edge where that end is 0: a weight decay, a floor or a warm-up of 0).
  `per_step`: how the knob counts in optimizer steps, for a move to another batch size (`at_batch`): 'ema'
  (a decay per step, as Adam's betas and Muon's momentum), 'steps' (a number of steps, as the LR warm-up) or
  '' (neither)."""

  field: str
  kind: str
  values: tuple[Any, ...]
  below: tuple[Any, ...] = ()
  above: tuple[Any, ...] = ()
  one_minus: bool = False
  per_step: str = ""

  def at_batch(self, value: Any, ratio: float) -> Any:
    """`value` at a batch `ratio` times as large, at the same tokens: a decay per step to the same decay per
    token (value ** ratio), a number of steps to the same tokens (value / ratio, rounded); others kept."""
    if self.per_step == "ema":
      return round(float(value) ** ratio, 7)
    if self.per_step == "steps":
      return round(int(value) / ratio)
    return value

  def value(self, u: float) -> Any:
    """The knob's value at `u` in [0, 1) (a Sobol coordinate)."""
    if self.kind in ("choice", "category"):
      return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
    if self.kind == "zero_or_log":
      if u < 0.5:
        return 0.0
      u = (u - 0.5) * 2
    lo, hi = self.values
    return self._flip(tuning.round_lr(lo + (hi - lo) * u if self.kind == "linear" else lo * (hi / lo) ** u))

  def beyond(self, value: Any) -> tuple[list[Any], str]:
    """(the further steps past the edge of its range `value` sits at, in order; what that edge is: 'low' or
    'high', 'hard edge', 'domain edge', 'categorical' or 'inside' (no steps)). A 'log' range's outer tenth
    counts as its edge; a value already past it (an earlier step kept) goes on with the steps beyond it."""
    if self.kind == "category":
      return [], "categorical"
    x = self._flip(value)
    if self.kind == "choice":
      low, high = x <= self.values[0], x >= self.values[-1]
    elif self.kind == "zero_or_log" and x == 0:
      return [], "domain edge"
    else:
      lo, hi = self.values
      at = (x - lo) / (hi - lo) if self.kind == "linear" else math.log(x / lo) / math.log(hi / lo)
      low, high = at <= 0.1 and self.kind in ("log", "linear"), at >= 0.9
    if not (low or high):
      return [], "inside"
    steps = [s for s in self.below if s < x] if low else [s for s in self.above if s > x]
    if not steps:
      return [], "domain edge" if low and x == 0 else "hard edge"
    return [self._flip(s) for s in steps], "low" if low else "high"

  def _flip(self, x: Any) -> Any:
    """1 - `x` where the range is of 1 - the value (`one_minus`), without the float's last-bit noise (1 - 5e-5
    is 0.99995, which 4 significant digits would round to 1); else `x`."""
    return round(1 - x, 12) if self.one_minus else x

  def describe(self) -> Record:
    """The knob as the record lists it."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _around(config: Config, name: str, further: tuple[int, ...] = ()) -> Knob:
  """`optim.<name>` continuous over x/÷ 4 around its value in `config`, its further steps x/÷ each of `further`
  (an LR ratio's: 8 and 16)."""
  x, r = float(config.optim[name]), tuning.round_lr
  return Knob(
    f"optim.{name}",
    "log",
    (r(x / 4), r(x * 4)),
    below=tuple(r(x / k) for k in further),
    above=tuple(r(x * k) for k in further),
  )


def _betas(b1: str, b2: str) -> list[Knob]:
  """An Adam's beta1 {0.8, 0.9, 0.95} and 1 - beta2 in [5e-5, 5e-2], with their further steps."""
  return [
    Knob(b1, "choice", (0.8, 0.9, 0.95), below=(0.7, 0.6, 0.5, 0.4), above=(0.98, 0.99), per_step="ema"),
    Knob(b2, "log", (5e-5, 5e-2), below=(2.5e-5, 1.25e-5), above=(0.1, 0.2), one_minus=True, per_step="ema"),
  ]


def _weight_decay(field: str, scale: float = 1.0) -> Knob:
  """A weight decay: 0 half the time, else log-uniform over [0.01, 1] times `scale`, its steps x 2 and 4."""
  r = tuning.round_lr
  return Knob(field, "zero_or_log", (r(0.01 * scale), r(scale)), above=(r(2 * scale), r(4 * scale)))


_SCHEDULE_KNOBS = ("optim.schedule", "optim.min_lr_ratio", "optim.decay_fraction")  # none under an owned schedule


def _shared_knobs(config: Config, warmup: int, shortest: int | None) -> list[Knob]:
  """The knobs both sides search: the LR warm-up (0, 1 and 3 times the preset's: {0, 50, 150} steps at
  `long`; those shorter than the side's `shortest` budget, whose run a longer warm-up would never leave),
  the schedule, its floor and cool-down, clipping and the init (the row's, or fan-in)."""
  fits = lambda w: shortest is None or w < shortest  # noqa: E731
  warmups = tuple(dict.fromkeys(w for w in (0, warmup, 3 * warmup) if fits(w)))
  return [
    Knob(
      "optim.warmup_steps",
      "choice",
      warmups,
      above=tuple(w for w in (6 * warmup, 12 * warmup) if fits(w)),
      per_step="steps",
    ),
    Knob("optim.schedule", "category", ("wsd", "cosine")),
    Knob("optim.min_lr_ratio", "choice", (0.0, 0.1, 0.3), above=(0.5, 0.7)),
    Knob("optim.decay_fraction", "choice", (0.2, 0.4, 0.6), below=(0.1, 0.05), above=(0.8, 1.0)),
    Knob("optim.grad_clip", "category", (1.0, 0.0)),
    Knob("model.init", "category", tuple(dict.fromkeys((str(config.model.init), "fan_in")))),
  ]


@dataclasses.dataclass(frozen=True)
class Centre:
  """Where a side's space is centred (its published setting, `centred`), as multiples of the reference
  AdamW's LR and weight decay, and why; `lacks`: the knobs of AdamW's space it has not, each with why (its
  page names them)."""

  lr: float = 1.0
  weight_decay: float = 1.0
  why: str = "the reference"
  lacks: tuple[str, ...] = ()


def centred_at(centre: Centre) -> Any:
  """Declares a space function's `Centre` (its attribute `centre`)."""

  def mark(space_fn: Any) -> Any:
    space_fn.centre = centre
    return space_fn

  return mark


@centred_at(Centre())
def adamw_space(config: Config, space: str) -> list[Knob]:
  """AdamW's space around `config` (its published setting): LR x/÷ 4, beta1 {0.8, 0.9, 0.95}, 1 - beta2
  in [5e-5, 5e-2], weight decay 0 or [0.01, 1], the embeddings' LR ratio ({0.5, 1, 2} in space 'v1';
  'symmetric': continuous x/÷ 4, and an untied head's too)."""
  if space == "v1":
    ratios = [Knob("optim.adamw_embed_lr_ratio", "choice", (0.5, 1.0, 2.0), below=(0.25, 0.125), above=(4.0, 8.0))]
  else:
    names = (
      ("adamw_embed_lr_ratio", "adamw_head_lr_ratio")
      if config.model.get("untied_head", False)
      else ("adamw_embed_lr_ratio",)
    )
    ratios = [_around(config, k, (8, 16)) for k in names]
  return [
    _around(config, "learning_rate"),
    *_betas("optim.b1", "optim.b2"),
    _weight_decay("optim.weight_decay"),
    *ratios,
  ]


@centred_at(Centre(why="its own recipe row's published setting, not AdamW's"))
def muon_groups_space(config: Config, space: str) -> list[Knob]:
  """`muon_groups`' space around `config`: LR x/÷ 4, Muon's momentum {0.85, 0.9, 0.95, 0.98}, its weight
  decay 0 or [0.01, 1], and the Adam groups': on a head tied to the token embedding, the tied matrix's LR
  ratio x/÷ 4 and betas as AdamW's; on an untied head (space 'symmetric'), the embeddings', the head's and
  the scalars' LR ratios x/÷ 4 and the groups' betas."""
  untied = bool(config.model.get("untied_head", False))
  if untied and space == "v1":
    raise ValueError(
      "--config.model.untied_head=True: the joint search's space 'v1' of 'muon_groups' searches the tied "
      "embedding-head's settings (optim.tied_*), which an untied head does not read; search a tied row "
      "(model.untied_head=False), or the 'symmetric' space (the study block's search_space=symmetric)"
    )
  names = ("embed_lr_ratio", "head_lr_ratio", "scalar_lr_ratio") if untied else ("tied_lr_ratio",)
  return [
    _around(config, "learning_rate"),
    Knob(
      "optim.muon_momentum",
      "choice",
      (0.85, 0.9, 0.95, 0.98),
      below=(0.8, 0.7, 0.6),
      above=(0.99, 0.995),
      per_step="ema",
    ),
    _weight_decay("optim.muon_weight_decay"),
    *(_around(config, k, (8, 16)) for k in names),
    *_betas(*(("optim.groups_b1", "optim.groups_b2") if untied else ("optim.tied_b1", "optim.tied_b2"))),
  ]


@centred_at(Centre(why="AdamW with Nesterov momentum: the same scale of update, so AdamW's setting"))
def nadamw_space(config: Config, space: str) -> list[Knob]:
  """NAdamW's space: AdamW's (`adamw_space`)."""
  return adamw_space(config, space)


@centred_at(
  Centre(
    lr=0.2,
    weight_decay=5.0,
    why="a sign update is larger per coordinate than AdamW's: Chen et al. 2023 (Lion) set its LR 3-10x below "
    "AdamW's and its weight decay 3-10x above, keeping their product; centred at 5x each way",
    lacks=("eps: a sign update divides by nothing",),
  )
)
def lion_space(config: Config, space: str) -> list[Knob]:
  """Lion's space around `config`: LR x/÷ 4, its betas (beta1 {0.9, 0.95, 0.99}; beta2 {0.95, 0.98, 0.99},
  the paper's and its language models'), its weight decay over the range AdamW's takes times the
  centre's factor and AdamW's LR ratios (`adamw_space`'s, of its `space`)."""
  return [
    _around(config, "learning_rate"),
    Knob("optim.lion_b1", "choice", (0.9, 0.95, 0.99), below=(0.8, 0.7), above=(0.995,), per_step="ema"),
    Knob("optim.lion_b2", "choice", (0.95, 0.98, 0.99), below=(0.9, 0.8), above=(0.995, 0.999), per_step="ema"),
    _weight_decay("optim.weight_decay", lion_space.centre.weight_decay),
    *(k for k in adamw_space(config, space) if k.field.startswith("optim.adamw_")),
  ]


@centred_at(
  Centre(
    lr=3.0,
    why="it spends no steps at a decayed rate: Defazio et al. 2024 (schedule-free) find its best AdamW LR 1-10x "
    "a scheduled AdamW's; centred at 3x",
    lacks=(
      "schedule, its floor and cool-down: it owns its schedule (the rate held after the warm-up)",
      "the embedding and head LR ratios: its averaging weights depend on the LR",
    ),
  )
)
def schedule_free_adamw_space(config: Config, space: str) -> list[Knob]:
  """Schedule-free AdamW's space around `config`: LR x/÷ 4, its interpolation beta1 {0.9, 0.95, 0.98}
  (its authors raise it for long runs), AdamW's beta2 and weight decay; of the shared knobs (`space_of`), it owns
  its schedule's."""
  return [
    _around(config, "learning_rate"),
    Knob("optim.b1", "choice", (0.9, 0.95, 0.98), below=(0.8, 0.7), above=(0.99, 0.995), per_step="ema"),
    _betas("optim.b1", "optim.b2")[1],
    _weight_decay("optim.weight_decay"),
  ]


def module_space(config: Config, space: str) -> list[Knob]:
  """A user's module's space (`optimizers.module`), its `SPACE` as knobs: a range 'log' or 'linear', feasible
  points as ordered choices where they are numbers (else a category); `learning_rate` is the schedule's peak,
  the others `optim.<BLOCK>.<knob>`."""
  del space
  knobs = []
  for knob, spec in module_lib.load(str(config.optim.name)).space.items():
    field = "optim.learning_rate" if knob == "learning_rate" else f"optim.{module_lib.BLOCK}.{knob}"
    if "feasible_points" in spec:
      points = tuple(spec["feasible_points"])
      numbers = all(isinstance(p, int | float) and not isinstance(p, bool) for p in points)
      knobs.append(Knob(field, "choice" if numbers else "category", tuple(sorted(points)) if numbers else points))
    else:
      knobs.append(Knob(field, str(spec["scaling"]), (spec["min"], spec["max"])))
  return knobs


def space_function(name: str) -> Any:
  """The space of optimizer `name`: the function of this module named `<name>_space` that declares its
  `Centre` (`centred_at`); a user's module's (`module_space`) for any name not a built-in's."""
  if name not in optim_lib.OPTIMIZERS:
    return module_space
  found = globals().get(f"{name}_space")
  if getattr(found, "centre", None) is None:
    have = [k.removesuffix("_space") for k, v in globals().items() if k.endswith("_space") and hasattr(v, "centre")]
    raise ValueError(f"--config.optim.name={name!r}: the joint search has a space for {', '.join(have)} only")
  return found


def space_of(config: Config, warmup: int, shortest: int | None = None, space: str = "symmetric") -> list[Knob]:
  """The space `space` (`SPACES`) of `config`'s optimizer around `config`'s values: its own knobs
  (`space_function`), then the shared knobs (`_shared_knobs`) but, where it owns its schedule, the schedule's,
  and a user's module's clipping (it clips in its own chain); `warmup`: the preset's LR warm-up, `shortest`:
  the side's shortest budget in steps (None: no bound on the warm-up)."""
  name = str(config.optim.name)
  own = space_function(name)(config, space)
  skip = (
    *(_SCHEDULE_KNOBS if owns_schedule(config) else ()),
    *(() if name in optim_lib.OPTIMIZERS else ("optim.grad_clip",)),
  )
  return own + [k for k in _shared_knobs(config, warmup, shortest) if k.field not in skip]


def centred(reference: Config, name: str) -> Config:
  """The reference AdamW's config moved to optimizer `name` (a built-in's, or a user's module's dotted path)
  at its space's `Centre`: the fields it shares with the reference kept (the schedule's, the betas it
  declares), those it does not read at their defaults, the LR and the weight decay times the centre's
  factors; an optimizer that owns its schedule with the rate held after the warm-up (`optim.min_lr_ratio`
  1.0)."""
  c = Config(reference.to_dict())
  centre = getattr(space_function(name), "centre", Centre())
  c.optim.name = name
  declared = optim_lib.OPTIMIZERS[name].fields if name in optim_lib.OPTIMIZERS else ()
  for f in optim_lib.OPTIMIZER_FIELDS:
    if f not in declared and f.name in c.optim:
      c.optim[f.name] = f.default
  if name not in optim_lib.OPTIMIZERS:
    c = module_lib.with_block(c, module_lib.load(name))
  c.optim.learning_rate = tuning.round_lr(float(reference.optim.learning_rate) * centre.lr)
  field, value = weight_decay_of(reference)
  target = weight_decay_field(c)
  if field and target:
    c.update_from_flattened_dict({target: tuning.round_lr(value * centre.weight_decay)})
  if owns_schedule(c):
    c.optim.min_lr_ratio = 1.0
  return c


def owns_schedule(config: Config) -> bool:
  """Whether `config`'s optimizer owns its schedule (a built-in's declaration, a module's `OWNS_SCHEDULE`)."""
  name = str(config.optim.name)
  if name in optim_lib.OPTIMIZERS:
    return optim_lib.OPTIMIZERS[name].owns_schedule
  return module_lib.load(name).owns_schedule


def sobol_points(dimensions: int, seed: int) -> np.ndarray:
  """`SOBOL_POINTS` points of a scrambled Sobol sequence in [0, 1)^dimensions (scipy's, seeded)."""
  from scipy.stats import qmc

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return qmc.Sobol(dimensions, scramble=True, rng=np.random.default_rng(seed)).random(SOBOL_POINTS)


def published_setting(config: Config, space: list[Knob]) -> Record:
  """The side's own values of the space's fields."""
  flat = config_lib.flatten(config)
  return {k.field: flat[k.field] for k in space}


def apply_setting(config: Config, setting: Record) -> Config:
  """`config` with `setting`'s fields; under the cosine schedule the cool-down (`optim.decay_fraction`,
  the 'wsd' schedule's alone) is left at its default, which no run reads."""
  c = Config(config.to_dict())
  c.update_from_flattened_dict(dict(setting))
  if c.optim.schedule != "wsd":
    c.optim.decay_fraction = preflight.field_defaults()["optim.decay_fraction"]
  return c


def read_at(runs: list[Record], iterate: str, beta: float | None) -> float:
  """The mean over `runs` of their loss at an iterate ('raw', or 'averaged' at `beta`)."""
  return statistics.fmean(tuning.iterate_loss(r, iterate, beta) for r in runs)


def best_reading(runs: list[Record]) -> tuple[float, str, float | None]:
  """(mean, iterate, beta): the lowest mean over `runs` at one iterate, raw or averaged at a beta."""
  options = [("raw", None)] + [("averaged", b) for b in AVERAGING_BETAS]
  return min(((read_at(runs, it, b), it, b) for it, b in options), key=lambda t: t[0])


class Setting:
  """One setting of a side: its fields (the LR among them), where it comes from, its side's search seeds and
  spare seed, its runs by seed, and the seeds whose runs stalled (not ranked). `first`: the first that many
  search seeds (all where None)."""

  def __init__(self, ident: str, origin: str, fields: Record, seeds: list[int], spare: int):
    self.ident, self.origin, self.fields, self.seeds, self.spare = ident, origin, dict(fields), seeds, spare
    self.runs: dict[int, Record] = {}
    self.stalled: list[int] = []

  def by_seed(self, first: int | None = None) -> dict[int, Record]:
    """Its runs on the `first` search seeds by seed, a stalled one replaced by its spare-seed run where that
    did not stall."""
    seeds = self.seeds[:first]
    out = {s: self.runs[s] for s in seeds if s in self.runs and s not in self.stalled}
    if any(s in self.stalled for s in seeds) and self.spare in self.runs and self.spare not in self.stalled:
      out[self.spare] = self.runs[self.spare]
    return out

  def ranked(self, first: int | None = None) -> list[Record]:
    """Its runs on the `first` search seeds (`by_seed`)."""
    return list(self.by_seed(first).values())

  def mean(self, first: int | None = None) -> float:
    """Its mean over the `first` search seeds at its best iterate (`best_reading`); inf where none of them ran."""
    runs = self.ranked(first)
    return best_reading(runs)[0] if runs else math.inf

  def record(self) -> Record:
    """The setting as the record lists it, with its two- and three-seed means where it ran on those."""
    two, three = self.ranked(2), self.ranked()
    return {
      "id": self.ident,
      "origin": self.origin,
      "config": self.fields,
      "seeds": sorted(self.runs),
      "stalled": self.stalled,
      "two_seed_mean": best_reading(two)[0] if len(two) == 2 else None,
      "three_seed_mean": best_reading(three)[0] if len(three) == 3 else None,
    }


class Search:
  """One side's search: its config, space, Sobol points, settings and every run it started."""

  def __init__(
    self,
    name: str,
    config: Config,
    space: list[Knob],
    seeds: list[int],
    spare: int,
    sobol_seed: int,
    margin: float,
    space_name: str = "symmetric",
  ):
    self.name, self.config, self.space, self.space_name = name, config, space, space_name
    self.seeds, self.spare, self.sobol_seed = [int(s) for s in seeds], int(spare), int(sobol_seed)
    self.n, self.margin = int(config.trainer.steps), float(margin)
    self.points = sobol_points(len(space), self.sobol_seed)
    self.used = 0  # Sobol points drawn
    self.settings: dict[str, Setting] = {}
    self.log: list[Record] = []  # every run started, in order
    self.steps_run = 0
    self.history: Record = {}
    self.curve: list[list[float]] = []  # [runs spent, the best two-seed mean so far] after each batch

  def cost(self) -> float:
    """The runs started so far, in N-run equivalents (their steps over N)."""
    return self.steps_run / self.n

  def add(self, origin: str, fields: Record, reuse: bool = False) -> Setting:
    """A new setting of `fields`; under the cosine schedule without the cool-down, which it does not read.
    `reuse`: the setting of the same fields where one exists (its runs are not run or counted twice)."""
    if fields.get("optim.schedule", "wsd") != "wsd":
      fields = {k: v for k, v in fields.items() if k != "optim.decay_fraction"}
    if reuse and (same := [s for s in self.settings.values() if s.fields == fields]):
      return same[0]
    ident = f"{self.name}-{len(self.settings)}"
    self.settings[ident] = setting = Setting(ident, origin, fields, self.seeds, self.spare)
    return setting

  def next_sobol(self) -> Setting:
    if self.used >= len(self.points):
      raise ValueError(f"the {self.name} search has drawn all {len(self.points)} Sobol points")
    u = self.points[self.used]
    self.used += 1
    return self.add(f"sobol {self.used - 1}", {k.field: k.value(float(x)) for k, x in zip(self.space, u)})


Request = tuple[Search, Setting, int]
Reading = tuple[str, float | None]  # the (iterate, beta) a comparison reads every setting at


def run_requests(requests: list[Request], runner: Runner, label: str) -> None:
  """Trains `requests` (search, setting, seed) in one batch, then the plateau rule over each touched
  setting's runs; a stalled run is re-run once on the spare seed (in a second batch), not ranked. Each
  touched search's tuning-cost curve gains a point."""
  searches: set[Search] = set()  # each gains one point of its curve, whatever the order
  while requests:  # at most twice: the second batch's settings have run on the spare seed
    run_specs = [
      specs.run_spec(
        apply_setting(search.config, setting.fields),
        kind="anchor",
        seed=seed,
        lr=float(setting.fields["optim.learning_rate"]),
        steps=search.n,
        beta=AVERAGING_BETAS[0],
        betas=AVERAGING_BETAS,
      )
      for search, setting, seed in requests
    ]
    results = runner.run(run_specs, label)
    touched: dict[Setting, Search] = {}
    for (search, setting, seed), r in zip(requests, results):
      setting.runs[seed] = r
      search.steps_run += int(r["steps"])
      search.log.append(
        {
          "setting": setting.ident,
          "seed": seed,
          "steps": int(r["steps"]),
          "final_raw": r["final_raw"],
          "final_averaged": r["final_averaged"],
        }
      )
      touched[setting] = search
      searches.add(search)
    requests, label = [], label + ": stalled runs on the spare seed"
    for setting, search in touched.items():
      curves = {setting.ident: {str(s): r["curve"] for s, r in setting.runs.items() if s not in setting.stalled}}
      flagged = sorted({int(flag["seed"]) for flag in plateau_runs(curves, search.n, search.margin, min_seeds=2)})
      setting.stalled += flagged
      for entry in search.log:
        if entry["setting"] == setting.ident and entry["seed"] in flagged:
          entry["stalled"] = True
      if search.spare not in setting.runs:
        requests += [(search, setting, search.spare) for _ in flagged]
  for search in searches:
    two = [s.mean(2) for s in search.settings.values() if len(s.ranked(2)) == 2]
    search.curve.append([search.cost(), min(two, default=None)])


@dataclasses.dataclass(frozen=True)
class Finishing:
  """What step 3 (`finish`) compares within: the search, its runner, the (iterate, beta) every comparison reads
  each setting at, and the search's total (N-run equivalents) its runs must fit in."""

  search: Search
  runner: Runner
  reading: Reading
  limit: float

  def run_three(self, settings: list[Setting], label: str) -> bool:
    """`settings` on the search seeds they have not run, in one batch, where those runs fit in `limit`; whether
    they did."""
    search = self.search
    todo = [(search, s, seed) for s in dict.fromkeys(settings) for seed in search.seeds if seed not in s.runs]
    if search.cost() + len(todo) > self.limit + 1e-9:
      return False
    run_requests(todo, self.runner, f"{search.name} search: {label}")
    return True

  def mean(self, setting: Setting) -> float:
    """`setting`'s mean over its runs at the reading."""
    return read_at(setting.ranked(), *self.reading)

  def wins(self, new: Setting, old: Setting) -> bool:
    """Whether `new` beats `old` on the seeds both ran by more than the noise of the difference."""
    a, b = new.by_seed(), old.by_seed()
    common = [s for s in a if s in b]
    loss = lambda runs: [tuning.iterate_loss(runs[s], *self.reading) for s in common]  # noqa: E731
    return tuning.wins_beyond_noise(loss(a), loss(b))["wins"]

  def as_chosen(self, fields: Record) -> Setting | None:
    """The combination `fields` run as chosen on the three seeds (None where that does not fit)."""
    chosen = self.search.add("as chosen", fields, reuse=True)
    return chosen if self.run_three([chosen], "as chosen") else None


def line_search(
  fin: Finishing, start: Setting, field: str, ratio: float, hard: float = math.inf
) -> tuple[Record | None, Setting]:
  """`start`'s `field` at its neighbours ÷ and x `ratio` on the three seeds; where the best wins by more than
  the noise of the difference over the centre (`Finishing.wins`), it becomes the centre and one further step
  past it is run, at most `LR_MOVES` moves, never above `hard`. Returns (its record, the setting at its
  centre); (None, `start`) where the first round does not fit."""
  centre, moves, stopped = float(start.fields[field]), 0, "bracketed"
  at = {centre: start}
  todo = [v for v in map(tuning.round_lr, (centre / ratio, centre * ratio)) if v <= hard]
  new = lambda v: fin.search.add(f"{field} of {start.ident}", start.fields | {field: v}, reuse=True)  # noqa: E731
  while fin.run_three([start] + [at.setdefault(v, new(v)) for v in todo], field):
    best = min(at, key=lambda v: fin.mean(at[v]))
    if best == centre:
      break
    if not fin.wins(at[best], at[centre]):
      stopped = "within noise"
      break
    further = tuning.round_lr(best * ratio if best > centre else best / ratio)
    moves, centre = moves + 1, best
    if moves >= LR_MOVES or further > hard:
      stopped = "at most LR_MOVES moves" if moves >= LR_MOVES else "hard edge"
      break
    todo = [further]
  else:
    if not moves:
      return None, start
    stopped = "budget"
  values = sorted(at)
  return {
    "field": field,
    "values": values,
    "means": [fin.mean(at[v]) for v in values],
    "centre": centre,
    "moves": moves,
    "stopped": stopped,
  }, at[centre]


def _fit_lr(line: Record) -> float:
  """The LR from a quadratic fit of the LR line search's three-seed means in log LR; its centre where the
  fit has no minimum inside the LRs run."""
  lrs, means = line["values"], line["means"]
  if len(lrs) >= 3:
    a, b, _ = np.polyfit(np.log(lrs), means, 2)
    if a > 0 and math.log(lrs[0]) <= (vertex := -b / (2 * a)) <= math.log(lrs[-1]):
      return tuning.round_lr(math.exp(vertex))
  return line["centre"]


def refine(fin: Finishing, start: Setting) -> Record | None:
  """(LR, weight decay) refined together from `start`: the LR's line search (x/÷ sqrt(2)) and its fit
  (`_fit_lr`), then the weight decay's (x/÷ 2, at the LR's centre; 0 is its domain's edge, kept), once
  more where either moved. None where the first LR round does not fit. Returns {"rounds", "best": the last
  centre run, "fields": its fields at the fitted LR}."""
  field = weight_decay_field(fin.search.config)
  knob = next((k for k in fin.search.space if k.field == field), None)
  rounds: list[Record] = []
  current = start
  for _ in range(2):
    lr, current = line_search(fin, current, "optim.learning_rate", math.sqrt(2))
    if lr is None:
      break
    wd = None
    if knob is not None and float(current.fields[field]) > 0:
      wd, current = line_search(fin, current, field, 2.0, max(knob.above, default=knob.values[1]))
    rounds.append(
      {
        "lr": lr | {"fitted": _fit_lr(lr)},
        "weight_decay": wd or {"field": field, "stopped": "domain edge" if knob else "not searched"},
      }
    )
    if not lr["moves"] and not (wd and wd["moves"]):
      break
  if not rounds:
    return None
  return {
    "rounds": rounds,
    "best": current,
    "fields": current.fields | {"optim.learning_rate": rounds[-1]["lr"]["fitted"]},
  }


def bracket(fin: Finishing, base: Setting) -> Record:
  """Each knob but the LR and the weight decay (`refine`'s), where its value in `base` sits at an edge of
  its range: its further steps past it (`Knob.beyond`) on the three seeds from `base`, each kept while it
  wins by more than the noise of the difference over the last kept (the first over `base`), at most
  `LR_MOVES`; the knobs in lockstep (each round's steps in one batch), each tried alone. Returns {"knobs":
  {field: {"edge", "tried", "kept", "stopped"}}, "kept": {field: its last value kept}}."""
  skip = {"optim.learning_rate", weight_decay_field(fin.search.config)}
  state = {
    k.field: {
      "edge": edge,
      "steps": steps[:LR_MOVES],
      "tried": [],
      "kept": None,
      "last": base,
      "stopped": None if steps else edge,
    }
    for k in fin.search.space
    if k.field not in skip and k.field in base.fields
    for steps, edge in [k.beyond(base.fields[k.field])]
  }
  while todo := [(f, st) for f, st in state.items() if st["stopped"] is None]:
    new = [
      fin.search.add(f"edge of {f}", base.fields | {f: st["steps"][len(st["tried"])]}, reuse=True) for f, st in todo
    ]
    if not fin.run_three(new, "edges"):
      for _, st in todo:
        st["stopped"] = "budget"
      break
    for (f, st), s in zip(todo, new):
      st["tried"].append(s.ident)
      if not fin.wins(s, st["last"]):
        st["stopped"] = "within noise"
        continue
      st["kept"], st["last"] = s.fields[f], s
      if len(st["tried"]) == len(st["steps"]):
        st["stopped"] = "hard edge" if len(st["steps"]) < LR_MOVES else "at most LR_MOVES moves"
  keys = ("edge", "tried", "kept", "stopped")
  return {
    "knobs": {f: {k: st[k] for k in keys} for f, st in state.items()},
    "kept": {f: st["kept"] for f, st in state.items() if st["kept"] is not None},
  }


def finish(
  search: Search, start: Setting, runner: Runner, budget: float = math.inf, iterate: str | None = None
) -> Record | None:
  """Step 3 from `start`, within `budget` (N-run equivalents): `refine`, `bracket` from its centre, the
  combination run as chosen, and where a knob moved since the LR was fitted, `refine` from it and the
  combination run once more. Every comparison reads the iterate and beta `start` reads best at, or the raw
  iterate (`iterate='raw'`). None where the first LR round or the first combination does not fit. The
  chosen setting reads the iterate (`iterate`, else its better one) and beta its own runs read best at."""
  reading = ("raw", None) if iterate == "raw" else best_reading(start.ranked())[1:]
  fin = Finishing(search, runner, reading, search.cost() + budget)
  first = refine(fin, start)
  if first is None:
    return None
  edges = bracket(fin, first["best"])
  chosen = fin.as_chosen(first["fields"] | edges["kept"])
  if chosen is None:
    return None
  again = refine(fin, chosen) if edges["kept"] else None
  if again:
    chosen = fin.as_chosen(again["fields"]) or chosen
  # its iterate, and its beta (the averaged iterate's, even where raw wins)
  averaging = tuning.choose_averaging(chosen.ranked(), AVERAGING_BETAS)
  chosen_iterate = iterate or averaging["iterate"]
  return {
    "from": start.ident,
    "reading": list(reading),
    "refine": [{"rounds": r["rounds"], "best": r["best"].ident} for r in (first, again) if r],
    "edges": edges,
    "as_chosen": chosen.ident,
    "fields": chosen.fields,
    "iterate": chosen_iterate,
    "beta": averaging["beta"],
    "three_seed_mean": averaging["iterate_losses"][chosen_iterate],
  }


def side_searches(
  sides: dict[str, Config],
  block: Config,
  config: Config,
  shortest: dict[str, int] | None = None,
) -> list[Search]:
  """One search per side (`sides`: name -> its config) over its space (`space_of`, the block's
  `search_space`, at the preset's LR warm-up and the side's shortest budget in `shortest`), on a study
  block's `search_seeds`, `spare_seed` and `sobol_seed`, with the benchmark's plateau margin."""
  warmup = int(config.optim.warmup_steps)  # the preset's LR warm-up, whose multiples the space offers
  space = str(block.search_space)
  return [
    Search(
      side,
      c,
      space_of(c, warmup, (shortest or {}).get(side), space),
      block.search_seeds,
      block.spare_seed,
      block.sobol_seed,
      config.benchmark.plateau_margin,
      space,
    )
    for side, c in sides.items()
  ]


def search_both(searches: list[Search], configs: int, runner: Runner, floor: float = 0.0) -> dict[str, Record]:
  """Steps 1-4 for every search (steps 1 and 2 in one batch each for all), `equalise` (to at least `floor`
  N-run equivalents: a side read from a record spent that), and where some side's search has not saturated
  (`saturation`), the same further budget for both."""
  requests = []
  for search in searches:
    first = [search.add("published", published_setting(search.config, search.space))]
    first += [search.next_sobol() for _ in range(configs)]
    requests += [(search, s, seed) for s in first for seed in search.seeds[:2]]
  run_requests(requests, runner, "joint search: step 1 (two seeds)")
  requests = []
  for search in searches:
    finalists = sorted(search.settings.values(), key=lambda s: s.mean(2))[:FINALISTS]
    search.history["finalists"] = [s.ident for s in finalists]
    requests += [(search, s, search.seeds[2]) for s in finalists]
  run_requests(requests, runner, "joint search: step 2 (third seed)")
  for search in searches:
    winner = min((search.settings[i] for i in search.history["finalists"]), key=lambda s: s.mean())
    search.history["winner"] = winner.ident
    search.history["chosen"] = finish(search, winner, runner)
  for search in searches:  # step 4: the raw iterate's setting
    start = min(
      (s for s in search.settings.values() if len(s.ranked()) == 3), key=lambda s: read_at(s.ranked(), "raw", None)
    )
    search.history["raw_chosen"] = finish(search, start, runner, iterate="raw")
  equalise(searches, runner, max(floor, *(search.cost() for search in searches)))
  checks = {search.name: saturation(search) for search in searches}
  costliest = max(search.cost() for search in searches)
  further = 0.0 if all(c["saturated"] for c in checks.values()) else FURTHER * costliest
  if further:
    equalise(searches, runner, costliest + further, "further_points")
  for search in searches:
    search.history["saturation"] = {
      "check": checks[search.name],
      "further_budget": further,
      "after": saturation(search) if further else None,
    }
  return {search.name: search_record(search, searches) for search in searches}


def equalise(searches: list[Search], runner: Runner, target: float, key: str = "equalising_points") -> None:
  """Each side spends what it lacks of `target` on further Sobol points
  (the first two seeds), until less than one configuration's cost is left; a point that beats the kept
  winner's two-seed mean goes on to the third seed and, where it beats its three-seed mean too, through
  step 3 within what is left. It replaces the winner where its chosen setting's three-seed mean is lower.
  The points drawn are listed under `key` in the side's history."""
  for search in searches:
    extra = search.history.setdefault(key, [])
    while target - search.cost() >= 2.0:  # a configuration: two runs of N steps
      point = search.next_sobol()
      extra.append(point.ident)
      run_requests([(search, point, s) for s in search.seeds[:2]], runner, f"{search.name} search: {key}")
      winner = search.settings[search.history["winner"]]
      if point.mean(2) >= winner.mean(2) or target - search.cost() < 1:
        continue
      run_requests([(search, point, search.seeds[2])], runner, f"{search.name} search: {key}, third seed")
      if point.mean() >= winner.mean():
        continue
      chosen = finish(search, point, runner, target - search.cost())
      if chosen is not None and chosen["three_seed_mean"] < search.history["chosen"]["three_seed_mean"]:
        search.history["winner"], search.history["chosen"] = point.ident, chosen


def _seed_sd(search: Search) -> float:
  """The seeds' sd of one setting's loss, pooled over the settings run on two seeds or more (each read at
  its best iterate)."""
  ss, df = 0.0, 0
  for s in search.settings.values():
    runs = s.ranked()
    if len(runs) >= 2:
      _, iterate, beta = best_reading(runs)
      ss += statistics.variance([tuning.iterate_loss(r, iterate, beta) for r in runs]) * (len(runs) - 1)
      df += len(runs) - 1
  return math.sqrt(ss / df) if df else 0.0


def saturation(search: Search) -> Record:
  """Whether the search's tuning-cost curve has saturated: its best two-seed mean improved over the last
  quarter of its runs by no more than one standard error of a two-seed mean (`_seed_sd` over sqrt(2))."""
  total = search.cost()
  best = min((b for _, b in search.curve if b is not None), default=None)
  then = min((b for c, b in search.curve if b is not None and c <= 0.75 * total), default=None)
  se = _seed_sd(search) / math.sqrt(2)
  improved = None if then is None else then - best  # `best` is over a superset of `then`'s points
  return {
    "runs": total,
    "best": best,
    "best_at_three_quarters": then,
    "improvement": improved,
    "se_two_seed_mean": se,
    "saturated": improved is not None and improved <= se,
  }


def search_record(search: Search, searches: list[Search]) -> Record:
  """A side's search as the record lists it: the space and the asymmetry it leaves, the Sobol seed, every
  setting and run, the chosen settings, the tuning-cost curve, its total and both sides' totals (N-run
  equivalents)."""
  return {
    "space": [k.describe() for k in search.space],
    "space_name": search.space_name,
    "asymmetry": SPACES[search.space_name],
    "sobol_seed": search.sobol_seed,
    "sobol": f"scipy.stats.qmc.Sobol(d={len(search.space)}, scramble=True, rng=default_rng(seed)), scipy "
    + importlib.metadata.version("scipy"),
    "sobol_points": search.used,
    "seeds": search.seeds,
    "spare_seed": search.spare,
    "settings": [s.record() for s in search.settings.values()],
    "runs": [e | {"config": search.settings[e["setting"]].fields} for e in search.log],
    **search.history,
    "tuning_curve": search.curve,
    "search_runs": search.cost(),
    "totals": {s.name: s.cost() for s in searches},
  }
