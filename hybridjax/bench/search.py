"""The joint search (`benchmark.tuner='joint'`): one procedure for every side of a comparison, over the
side's space of knobs (`adamw_space`, `muon_groups_space`), every run N steps on the search seeds.

1. `configs` points of a scrambled Sobol sequence (scipy's, its seed recorded) over the space, and the
   side's published setting, each on the first two search seeds;
2. the `FINALISTS` best by two-seed mean on the third seed, the best by three-seed mean kept;
3. its LR at its sqrt(2) neighbours on the three seeds, moved (at most `LR_MOVES` times) while a neighbour
   wins; the final LR from a quadratic fit of the three-seed means in log LR (the best LR run where the
   fit has no minimum inside the LRs run);
4. each knob whose chosen value sits at an edge of its range is tried one step beyond it on the three
   seeds (at the best LR run), and kept where it wins.

A setting's mean is read at its best iterate: the raw one or the averaged one at one of `AVERAGING_BETAS`,
the same for all its seeds. A stalled run (the plateau rule, `figures.plateau_runs`, among the setting's
own seeds) is re-run once on the spare seed and not ranked. `equalise` then gives the side that spent
less the difference, in N-run equivalents (every run's steps over N), as further Sobol points on the
first two seeds; one that beats the kept winner's two-seed mean goes through steps 2-4 within what is left.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import statistics
import warnings
from typing import Any

import ml_collections
import numpy as np

from hybridjax import preflight
from hybridjax.bench import specs, tuning
from hybridjax.bench.figures import plateau_runs
from hybridjax.bench.runs.runner import Runner

AVERAGING_BETAS = (0.98, 0.99, 0.995, 0.998, 0.999)
"""The averaging betas every search run records; a setting is read at the best of them (or raw)."""
FINALISTS = 4  # the settings of step 1 that go on to the third seed
LR_MOVES = 2  # how often step 3 may move the LR to a winning neighbour
SOBOL_POINTS = 2**8  # the Sobol block drawn (a power of 2, its balance): the first `configs`, then the extras


@dataclasses.dataclass(frozen=True)
class Knob:
  """One dimension of a side's space: the config field it sets (dotted) and its values.

  kind 'choice': one of `values`; 'log': log-uniform in [values[0], values[1]] (of 1 - the value when
  `one_minus`, as for Adam's beta2); 'zero_or_log': 0 half the time, else log-uniform in the range.
  `below` / `above`: the value one step beyond the range's low / high edge (None: a hard edge).
  `per_step`: how the knob counts in optimizer steps, for a move to another batch size (`at_batch`): 'ema'
  (a decay per step, as Adam's betas and Muon's momentum), 'steps' (a number of steps, as the LR warm-up) or
  '' (neither)."""

  field: str
  kind: str
  values: tuple[Any, ...]
  below: Any = None
  above: Any = None
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
    if self.kind == "choice":
      return self.values[min(int(u * len(self.values)), len(self.values) - 1)]
    if self.kind == "zero_or_log":
      if u < 0.5:
        return 0.0
      u = (u - 0.5) * 2
    lo, hi = self.values
    x = tuning.round_lr(lo * (hi / lo) ** u)
    return _one_minus(x) if self.one_minus else x

  def edge(self, value: Any) -> Any:
    """The value one step beyond the edge `value` sits at (a 'log' range's outer tenth counts as its
    edge), or None: not at an edge, or at a hard one."""
    if self.kind == "choice":
      if value == self.values[0]:
        return self.below
      return self.above if value == self.values[-1] else None
    x = 1 - value if self.one_minus else value
    if x == 0:
      return None  # 'zero_or_log' at 0: a hard edge
    lo, hi = self.values
    at = math.log(x / lo) / math.log(hi / lo)
    step = self.below if at <= 0.1 and self.kind == "log" else self.above if at >= 0.9 else None
    return None if step is None else (_one_minus(step) if self.one_minus else step)

  def describe(self) -> dict[str, Any]:
    """The knob as the record lists it."""
    return dataclasses.asdict(self) | {"values": list(self.values)}


def _one_minus(x: float) -> float:
  """1 - `x` without the float's last-bit noise (1 - 5e-5 is 0.99995, which 4 significant digits would round to 1)."""
  return round(1 - x, 12)


def _lr_knob(lr: float) -> Knob:
  return Knob("optim.learning_rate", "log", (tuning.round_lr(lr / 4), tuning.round_lr(lr * 4)))


def _shared_knobs(config: ml_collections.ConfigDict, warmup: int, shortest: int | None) -> list[Knob]:
  """The knobs both sides search: the LR warm-up (0, 1 and 3 times the preset's: {0, 50, 150} steps at
  `long`; those shorter than the side's `shortest` budget, whose run a longer warm-up would never leave),
  the schedule, its floor and cool-down, clipping and the init (the row's, or fan-in)."""
  inits = tuple(dict.fromkeys((str(config.model.init), "fan_in")))
  fits = lambda w: shortest is None or w < shortest  # noqa: E731
  warmups = tuple(dict.fromkeys(w for w in (0, warmup, 3 * warmup) if fits(w)))
  return [
    Knob("optim.warmup_steps", "choice", warmups, above=6 * warmup if fits(6 * warmup) else None, per_step="steps"),
    Knob("optim.schedule", "choice", ("wsd", "cosine")),
    Knob("optim.min_lr_ratio", "choice", (0.0, 0.1, 0.3), above=0.5),
    Knob("optim.decay_fraction", "choice", (0.2, 0.4, 0.6), below=0.1, above=0.8),
    Knob("optim.grad_clip", "choice", (1.0, 0.0)),
    Knob("model.init", "choice", inits),
  ]


def adamw_space(config: ml_collections.ConfigDict, warmup: int, shortest: int | None = None) -> list[Knob]:
  """AdamW's space around `config` (its published setting): LR x/÷ 4, beta1 {0.8, 0.9, 0.95}, 1 - beta2
  in [5e-5, 5e-2], weight decay 0 or [0.01, 1], the embeddings' LR ratio {0.5, 1, 2} and the shared knobs."""
  return [
    _lr_knob(float(config.optim.learning_rate)),
    Knob("optim.b1", "choice", (0.8, 0.9, 0.95), below=0.7, above=0.98, per_step="ema"),
    Knob("optim.b2", "log", (5e-5, 5e-2), below=2.5e-5, above=0.1, one_minus=True, per_step="ema"),
    Knob("optim.weight_decay", "zero_or_log", (0.01, 1.0), above=2.0),
    Knob("optim.adamw_embed_lr_ratio", "choice", (0.5, 1.0, 2.0), below=0.25, above=4.0),
    *_shared_knobs(config, warmup, shortest),
  ]


def muon_groups_space(config: ml_collections.ConfigDict, warmup: int, shortest: int | None = None) -> list[Knob]:
  """`muon_groups`' space around `config`, on a model whose head is tied to the token embedding (its one
  Adam matrix): LR x/÷ 4, Muon's momentum {0.85, 0.9, 0.95, 0.98}, its weight decay 0 or [0.01, 1], the
  tied matrix's LR ratio x/÷ 4 and betas as AdamW's, and the shared knobs."""
  if config.model.get("untied_head", False):
    raise ValueError(
      "--config.model.untied_head=True: the joint search of 'muon_groups' searches the tied embedding-head's "
      "settings (optim.tied_*), which an untied head does not read; search a tied row (model.untied_head=False)"
    )
  tied = float(config.optim.tied_lr_ratio)
  return [
    _lr_knob(float(config.optim.learning_rate)),
    Knob("optim.muon_momentum", "choice", (0.85, 0.9, 0.95, 0.98), below=0.8, above=0.99, per_step="ema"),
    Knob("optim.muon_weight_decay", "zero_or_log", (0.01, 1.0), above=2.0),
    Knob(
      "optim.tied_lr_ratio",
      "log",
      (tuning.round_lr(tied / 4), tuning.round_lr(tied * 4)),
      below=tuning.round_lr(tied / 8),
      above=tuning.round_lr(tied * 8),
    ),
    Knob("optim.tied_b1", "choice", (0.8, 0.9, 0.95), below=0.7, above=0.98, per_step="ema"),
    Knob("optim.tied_b2", "log", (5e-5, 5e-2), below=2.5e-5, above=0.1, one_minus=True, per_step="ema"),
    *_shared_knobs(config, warmup, shortest),
  ]


def space_of(config: ml_collections.ConfigDict, warmup: int, shortest: int | None = None) -> list[Knob]:
  """The space of `config`'s optimizer ('adamw' or 'muon_groups'), around `config`'s values; `warmup`: the
  preset's LR warm-up, `shortest`: the side's shortest budget in steps (None: no bound on the warm-up)."""
  spaces = {"adamw": adamw_space, "muon_groups": muon_groups_space}
  name = str(config.optim.name)
  if name not in spaces:
    raise ValueError(f"--config.optim.name={name!r}: the joint search has a space for {' and '.join(spaces)} only")
  return spaces[name](config, warmup, shortest)


def sobol_points(dimensions: int, seed: int) -> np.ndarray:
  """`SOBOL_POINTS` points of a scrambled Sobol sequence in [0, 1)^dimensions (scipy's, seeded)."""
  from scipy.stats import qmc

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return qmc.Sobol(dimensions, scramble=True, rng=np.random.default_rng(seed)).random(SOBOL_POINTS)


def published_setting(config: ml_collections.ConfigDict, space: list[Knob]) -> dict[str, Any]:
  """The side's own values of the space's fields."""
  flat = config_values(config)
  return {k.field: flat[k.field] for k in space}


def config_values(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return {
    f"{block}.{k}": v for block in ("optim", "model") for k, v in config[block].items() if not isinstance(v, dict)
  }


def apply_setting(config: ml_collections.ConfigDict, setting: dict[str, Any]) -> ml_collections.ConfigDict:
  """`config` with `setting`'s fields; under the cosine schedule the cool-down (`optim.decay_fraction`,
  the 'wsd' schedule's alone) is left at its default, which no run reads."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.update_from_flattened_dict(dict(setting))
  if c.optim.schedule != "wsd":
    c.optim.decay_fraction = preflight.field_defaults()["optim.decay_fraction"]
  return c


def read_at(runs: list[dict[str, Any]], iterate: str, beta: float | None) -> float:
  """The mean over `runs` of their loss at an iterate ('raw', or 'averaged' at `beta`)."""
  return statistics.fmean(tuning.iterate_loss(r, iterate, beta) for r in runs)


def best_reading(runs: list[dict[str, Any]]) -> tuple[float, str, float | None]:
  """(mean, iterate, beta): the lowest mean over `runs` at one iterate, raw or averaged at a beta."""
  options = [("raw", None)] + [("averaged", b) for b in AVERAGING_BETAS]
  return min(((read_at(runs, it, b), it, b) for it, b in options), key=lambda t: t[0])


class Setting:
  """One setting of a side: its fields (the LR among them), where it comes from, its runs by seed, and
  the seeds whose runs stalled (not ranked)."""

  def __init__(self, ident: str, origin: str, fields: dict[str, Any], spare: int):
    self.ident, self.origin, self.fields, self.spare = ident, origin, dict(fields), spare
    self.runs: dict[int, dict[str, Any]] = {}
    self.stalled: list[int] = []

  def ranked(self, seeds: list[int]) -> list[dict[str, Any]]:
    """Its runs on `seeds`, a stalled one replaced by its spare-seed run where that did not stall."""
    out = [self.runs[s] for s in seeds if s in self.runs and s not in self.stalled]
    stalled = any(s in self.stalled for s in seeds)
    if stalled and self.spare in self.runs and self.spare not in self.stalled:
      out.append(self.runs[self.spare])
    return out

  def mean(self, seeds: list[int]) -> float:
    """Its mean over `seeds` at its best iterate (`best_reading`); inf where none of them ran."""
    runs = self.ranked(seeds)
    return best_reading(runs)[0] if runs else math.inf

  def record(self, seeds: list[int]) -> dict[str, Any]:
    """The setting as the record lists it, with its two- and three-seed means where it ran on those."""
    two, three = self.ranked(seeds[:2]), self.ranked(seeds)
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
    config: ml_collections.ConfigDict,
    space: list[Knob],
    seeds: list[int],
    spare: int,
    sobol_seed: int,
    margin: float,
  ):
    self.name, self.config, self.space = name, config, space
    self.seeds, self.spare, self.sobol_seed, self.margin = list(seeds), int(spare), int(sobol_seed), float(margin)
    self.n = int(config.trainer.steps)
    self.points = sobol_points(len(space), sobol_seed)
    self.used = 0  # Sobol points drawn
    self.settings: dict[str, Setting] = {}
    self.log: list[dict[str, Any]] = []  # every run started, in order
    self.steps_run = 0
    self.history: dict[str, Any] = {}

  def cost(self) -> float:
    """The runs started so far, in N-run equivalents (their steps over N)."""
    return self.steps_run / self.n

  def add(self, origin: str, fields: dict[str, Any]) -> Setting:
    """A new setting of `fields`; under the cosine schedule without the cool-down, which it does not read."""
    if fields.get("optim.schedule", "wsd") != "wsd":
      fields = {k: v for k, v in fields.items() if k != "optim.decay_fraction"}
    ident = f"{self.name}-{len(self.settings)}"
    self.settings[ident] = Setting(ident, origin, fields, self.spare)
    return self.settings[ident]

  def next_sobol(self) -> Setting:
    if self.used >= len(self.points):
      raise ValueError(f"the {self.name} search has drawn all {len(self.points)} Sobol points")
    u = self.points[self.used]
    self.used += 1
    return self.add(f"sobol {self.used - 1}", {k.field: k.value(float(x)) for k, x in zip(self.space, u)})

  def spec(self, setting: Setting, seed: int) -> dict[str, Any]:
    c = apply_setting(self.config, setting.fields)
    betas = list(AVERAGING_BETAS)
    lr = float(setting.fields["optim.learning_rate"])
    return specs.run_spec(c, kind="anchor", seed=seed, lr=lr, steps=self.n, beta=betas[0], betas=betas)


Request = tuple[Search, Setting, int]


def run_requests(requests: list[Request], runner: Runner, label: str) -> None:
  """Trains `requests` (search, setting, seed) in one batch, then the plateau rule over each touched
  setting's runs; a stalled run is re-run once on the spare seed (in a second batch), not ranked."""
  for _ in range(2):
    if not requests:
      return
    results = runner.run([search.spec(setting, seed) for search, setting, seed in requests], label)
    touched: dict[int, tuple[Search, Setting]] = {}
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
      touched[id(setting)] = (search, setting)
    requests, label = [], label + ": stalled runs on the spare seed"
    for search, setting in touched.values():
      curves = {setting.ident: {str(s): r["curve"] for s, r in setting.runs.items() if s not in setting.stalled}}
      flagged = sorted({int(flag["seed"]) for flag in plateau_runs(curves, search.n, search.margin, min_seeds=2)})
      for seed in flagged:
        setting.stalled.append(seed)
        for entry in search.log:
          if entry["setting"] == setting.ident and entry["seed"] == seed:
            entry["stalled"] = True
        if search.spare not in setting.runs:
          requests.append((search, setting, search.spare))


def _winner(search: Search, settings: list[Setting]) -> Setting:
  return min(settings, key=lambda s: s.mean(search.seeds))


def lr_steps(search: Search, start: Setting, runner: Runner, budget: float = math.inf) -> dict[str, Any] | None:
  """Step 3 for `start` (run on the three seeds): its LR at its sqrt(2) neighbours, moved while a neighbour
  wins (at most `LR_MOVES` times), then the quadratic fit in log LR. Each round only if its runs fit in
  `budget` (N-run equivalents); None where the first round does not."""
  seeds = search.seeds
  by_lr = {float(start.fields["optim.learning_rate"]): start}
  _, iterate, beta = best_reading(start.ranked(seeds))
  center, moves = float(start.fields["optim.learning_rate"]), 0

  def at(lr: float) -> Setting:
    if lr not in by_lr:
      by_lr[lr] = search.add(f"LR of {start.ident}", start.fields | {"optim.learning_rate": lr})
    return by_lr[lr]

  def score(s: Setting) -> float:
    return read_at(s.ranked(seeds), iterate, beta)

  spent = 0.0
  todo = [tuning.round_lr(center / math.sqrt(2)), tuning.round_lr(center * math.sqrt(2))]
  while True:
    new = [lr for lr in todo if lr not in by_lr]
    if len(new) * len(seeds) > budget - spent:
      if moves == 0 and len(by_lr) == 1:
        return None
      break
    run_requests([(search, at(lr), s) for lr in new for s in seeds], runner, f"{search.name} search: LR neighbours")
    spent += len(new) * len(seeds)
    best = min(by_lr, key=lambda lr: score(by_lr[lr]))
    if best == center or moves >= LR_MOVES:
      break
    moves += 1
    step = math.sqrt(2) if best > center else 1 / math.sqrt(2)
    center, todo = best, [tuning.round_lr(best * step)]
  lrs = sorted(by_lr)
  means = [score(by_lr[lr]) for lr in lrs]
  best_run = lrs[int(np.argmin(means))]
  fitted = best_run
  if len(lrs) >= 3:
    a, b, _ = np.polyfit(np.log(lrs), means, 2)
    if a > 0 and math.log(lrs[0]) <= -b / (2 * a) <= math.log(lrs[-1]):
      fitted = tuning.round_lr(math.exp(-b / (2 * a)))
  return {
    "lrs": lrs,
    "means": means,
    "iterate": iterate,
    "beta": beta,
    "moves": moves,
    "best_run_lr": best_run,
    "fitted_lr": fitted,
    "best": by_lr[best_run],
  }


def edge_steps(search: Search, best: Setting, runner: Runner, budget: float = math.inf) -> dict[str, Any]:
  """Step 4: each knob but the LR whose value in `best` sits at an edge of its range, one step beyond it
  on the three seeds (within `budget`); each that wins is kept."""
  seeds = search.seeds
  tried = []
  for knob in [k for k in search.space[1:] if k.field in best.fields]:
    beyond = knob.edge(best.fields[knob.field])
    if beyond is not None and len(tried) * len(seeds) + len(seeds) <= budget:
      tried.append((knob, search.add(f"edge of {knob.field}", best.fields | {knob.field: beyond})))
  run_requests([(search, s, seed) for _, s in tried for seed in seeds], runner, f"{search.name} search: edges")
  base = best.mean(seeds)
  kept = {knob.field: s.fields[knob.field] for knob, s in tried if s.mean(seeds) < base}
  return {"tried": [s.ident for _, s in tried], "kept": kept}


def finish(search: Search, start: Setting, runner: Runner, budget: float = math.inf) -> dict[str, Any] | None:
  """Steps 3 and 4 for `start`; the chosen setting: its fields with the edges kept and the fitted LR, and
  the iterate and beta its best LR's runs read best at."""
  before = search.cost()
  lr = lr_steps(search, start, runner, budget)
  if lr is None:
    return None
  edges = edge_steps(search, lr["best"], runner, budget - (search.cost() - before))
  best = lr["best"]
  runs = best.ranked(search.seeds)  # its iterate, and its beta (the averaged iterate's, even where raw wins)
  beta = min(AVERAGING_BETAS, key=lambda b: read_at(runs, "averaged", b))
  losses = {"raw": read_at(runs, "raw", None), "averaged": read_at(runs, "averaged", beta)}
  iterate = min(losses, key=losses.get)
  mean = losses[iterate]
  fields = best.fields | edges["kept"] | {"optim.learning_rate": lr["fitted_lr"]}
  return {
    "from": start.ident,
    "lr": {k: v for k, v in lr.items() if k != "best"} | {"best": best.ident},
    "edges": edges,
    "fields": fields,
    "iterate": iterate,
    "beta": beta,
    "three_seed_mean": mean,
  }


def side_searches(
  sides: dict[str, ml_collections.ConfigDict],
  block: ml_collections.ConfigDict,
  config: ml_collections.ConfigDict,
  shortest: dict[str, int] | None = None,
) -> list[Search]:
  """One search per side (`sides`: name -> its config) over its space (`space_of`, at the preset's LR
  warm-up and the side's shortest budget in `shortest`), on a study block's `search_seeds`,
  `spare_seed` and `sobol_seed`, with the benchmark's plateau margin."""
  warmup = int(config.optim.warmup_steps)  # the preset's LR warm-up, whose multiples the space offers
  return [
    Search(
      side,
      c,
      space_of(c, warmup, (shortest or {}).get(side)),
      [int(s) for s in block.search_seeds],
      int(block.spare_seed),
      int(block.sobol_seed),
      float(config.benchmark.plateau_margin),
    )
    for side, c in sides.items()
  ]


def search_both(searches: list[Search], configs: int, runner: Runner) -> dict[str, dict[str, Any]]:
  """Steps 1-4 for every search (steps 1 and 2 in one batch each for all), then `equalise`."""
  requests = []
  for search in searches:
    first = [search.add("published", published_setting(search.config, search.space))]
    first += [search.next_sobol() for _ in range(configs)]
    requests += [(search, s, seed) for s in first for seed in search.seeds[:2]]
  run_requests(requests, runner, "joint search: step 1 (two seeds)")
  requests = []
  for search in searches:
    ranked = sorted(search.settings.values(), key=lambda s: s.mean(search.seeds[:2]))
    search.history["finalists"] = [s.ident for s in ranked[:FINALISTS]]
    requests += [(search, s, search.seeds[2]) for s in ranked[:FINALISTS]]
  run_requests(requests, runner, "joint search: step 2 (third seed)")
  for search in searches:
    winner = _winner(search, [search.settings[i] for i in search.history["finalists"]])
    search.history["winner"] = winner.ident
    search.history["chosen"] = finish(search, winner, runner)
  equalise(searches, runner)
  return {search.name: search_record(search, searches) for search in searches}


def equalise(searches: list[Search], runner: Runner) -> None:
  """The side that spent less spends the difference on further Sobol points (the first two seeds), until the
  totals differ by less than one configuration's cost; a point that beats the kept winner's two-seed mean
  goes on to the third seed and, where it beats its three-seed mean too, through steps 3 and 4, each within
  what is left. It replaces the winner where its chosen setting's three-seed mean is lower."""
  extra: dict[str, list[str]] = {s.name: [] for s in searches}
  while True:
    cheap = min(searches, key=Search.cost)
    left = max(s.cost() for s in searches) - cheap.cost()
    one = 2.0  # a configuration: two runs of N steps
    if left < one:
      break
    point = cheap.next_sobol()
    extra[cheap.name].append(point.ident)
    run_requests([(cheap, point, s) for s in cheap.seeds[:2]], runner, f"{cheap.name} search: equal budget")
    winner = cheap.settings[cheap.history["winner"]]
    left = max(s.cost() for s in searches) - cheap.cost()
    if point.mean(cheap.seeds[:2]) >= winner.mean(cheap.seeds[:2]) or left < 1:
      continue
    run_requests([(cheap, point, cheap.seeds[2])], runner, f"{cheap.name} search: equal budget, third seed")
    if point.mean(cheap.seeds) >= winner.mean(cheap.seeds):
      continue
    left = max(s.cost() for s in searches) - cheap.cost()
    chosen = finish(cheap, point, runner, left)
    if chosen is not None and chosen["three_seed_mean"] < cheap.history["chosen"]["three_seed_mean"]:
      cheap.history["winner"], cheap.history["chosen"] = point.ident, chosen
  for search in searches:
    search.history["equalising_points"] = extra[search.name]


def search_record(search: Search, searches: list[Search]) -> dict[str, Any]:
  """A side's search as the record lists it: the space, the Sobol seed, every setting and run, the chosen
  setting, its total and both sides' totals (N-run equivalents)."""
  return {
    "space": [k.describe() for k in search.space],
    "sobol_seed": search.sobol_seed,
    "sobol": f"scipy.stats.qmc.Sobol(d={len(search.space)}, scramble=True, rng=default_rng(seed)), scipy "
    + importlib.metadata.version("scipy"),
    "sobol_points": search.used,
    "seeds": search.seeds,
    "spare_seed": search.spare,
    "settings": [s.record(search.seeds) for s in search.settings.values()],
    "runs": [e | {"config": search.settings[e["setting"]].fields} for e in search.log],
    **search.history,
    "search_runs": search.cost(),
    "totals": {s.name: s.cost() for s in searches},
  }


def searched(config: ml_collections.ConfigDict, chosen: dict[str, Any]) -> ml_collections.ConfigDict:
  """`config` at the search's chosen setting."""
  return apply_setting(config, chosen["fields"])
