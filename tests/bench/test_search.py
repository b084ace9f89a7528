"""The joint search (`bench.search`) on stub runs (nothing trains): both sides searched alike, at equal
cost, never on a headline seed, a stalled run re-run on the spare seed and not ranked."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import search, speedrun

SEEDS, SPARE = [1001, 1002, 1003], 1004
BEST_LR = {"adamw": 0.04, "muon_groups": 0.02}  # AdamW's above its published 0.012 x sqrt(2)^2: the LR moves


def _configs():
  c = benchmark_cfg.get_config("quick")
  names = list(speedrun.TRICKS)
  adamw = speedrun.apply_tricks(c, names[: names.index("rotary") + 1])
  muon = speedrun.apply_tricks(c, names[: names.index("muon") + 1])
  adamw.optim.learning_rate, muon.optim.learning_rate = 0.012, 0.02
  return c, adamw, muon


def _stub(spec):
  """A loss quadratic in log LR around the side's best LR, lower with b1 0.95 (AdamW) or momentum 0.98
  (Muon: at its range's edge, so step 4 tries 0.99), plus 0.01 per seed; AdamW's published setting
  stalls on seed 1001 (its curve ten times as high at N/10 and at N)."""
  c = spec["config"]
  o, n = c["optim"], c["trainer"]["steps"]
  lr = o["learning_rate"]
  loss = 2.5 + 0.3 * math.log(lr / BEST_LR[o["name"]]) ** 2 + 0.01 * (c["seed"] - 1000)
  loss -= 0.05 * (o["b1"] == 0.95) if o["name"] == "adamw" else 0.05 * (o["muon_momentum"] >= 0.98)
  stalled = o["name"] == "adamw" and c["seed"] == 1001 and lr == 0.012 and o["b2"] == 0.95 and o["b1"] == 0.9
  at = 10 * loss if stalled else loss
  averaged = {str(b): loss - 0.01 * (b == 0.995) for b in spec["betas"]}
  return {
    "seed": c["seed"],
    "steps": n,
    "lr": lr,
    "curve": [{"step": n // 10, "eval_loss_raw": at}, {"step": n, "eval_loss_raw": at}],
    "final_raw": loss + 0.02,
    "final_averaged": averaged,
  }


@pytest.fixture(scope="module")
def searched():
  return _searched()


def _searched():
  c, adamw, muon = _configs()
  runner = SpecRunner(_stub)
  warmup = int(c.optim.warmup_steps)
  sides = [
    search.Search(name, x, search.space_of(x, warmup), SEEDS, SPARE, 0, 0.05)
    for name, x in (("adamw", adamw), ("muon", muon))
  ]
  return c, search.search_both(sides, 24, runner), runner


@pytest.mark.slow  # scipy.stats's import and about 300 run specs (seconds)
def test_both_sides_cost_the_same_within_one_configuration_and_no_headline_seed_runs(searched):
  c, records, runner = searched
  adamw, muon = records["adamw"], records["muon"]
  assert adamw["totals"] == muon["totals"]
  totals = adamw["totals"]
  assert abs(totals["adamw"] - totals["muon"]) < 2.0  # one configuration: two runs of N steps
  # Every run is counted: the totals are the runs' steps over N, and the json lists every run.
  n = int(c.trainer.steps)
  for side, rec in records.items():
    assert rec["search_runs"] == totals[side] == sum(r["steps"] for r in rec["runs"]) / n
    assert all({"config", "seed", "steps", "final_raw", "final_averaged"} <= set(r) for r in rec["runs"])
  assert len(runner.specs) == sum(len(rec["runs"]) for rec in records.values())
  # Only the search's seeds ran: none of the study's headline or plateau seeds.
  seeds = {s["config"]["seed"] for s in runner.specs}
  assert seeds <= set(SEEDS) | {SPARE}
  block = c.benchmark.optimizers
  assert not seeds & ({int(s) for s in block.seeds} | {int(s) for s in block.plateau_seeds})
  # The side that spent less got the difference as further Sobol points, on the first two seeds.
  extra = adamw["equalising_points"] + muon["equalising_points"]
  assert extra and not (adamw["equalising_points"] and muon["equalising_points"])
  assert adamw["sobol_points"] >= 24 and muon["sobol_points"] >= 24


@pytest.mark.slow  # scipy.stats's import and about 300 run specs (seconds)
def test_the_search_finds_the_stubs_optimum_and_fits_the_lr(searched):
  _, records, _ = searched
  adamw, muon = records["adamw"]["chosen"], records["muon"]["chosen"]
  # AdamW: b1 0.95 wins; the LR, moved towards 0.04, is fitted in log LR near the stub's optimum.
  assert adamw["fields"]["optim.b1"] == 0.95
  assert abs(math.log(adamw["fields"]["optim.learning_rate"] / BEST_LR["adamw"])) < math.log(math.sqrt(2)) / 2
  assert abs(math.log(muon["fields"]["optim.learning_rate"] / BEST_LR["muon_groups"])) < math.log(math.sqrt(2)) / 2
  assert adamw["lr"]["moves"] <= search.LR_MOVES
  # Muon's momentum at 0.98, its range's edge, is tried one step beyond (0.99) and kept where it wins.
  assert muon["fields"]["optim.muon_momentum"] in (0.98, 0.99)
  assert any("optim.muon_momentum" in s for s in muon["edges"]["tried"] for s in [_origin(records["muon"], s)])
  # The averaged iterate at 0.995 reads lowest in the stub.
  assert (adamw["iterate"], adamw["beta"]) == ("averaged", 0.995)


def _origin(record, ident):
  return next(s["origin"] for s in record["settings"] if s["id"] == ident)


@pytest.mark.slow  # scipy.stats's import and about 300 run specs (seconds)
def test_a_stalled_run_is_rerun_on_the_spare_seed_and_not_ranked(searched):
  _, records, _ = searched
  published = next(s for s in records["adamw"]["settings"] if s["origin"] == "published")
  assert published["stalled"] == [1001] and SPARE in published["seeds"]
  # Its two-seed mean reads seeds 1002 and 1004, not the stalled run.
  runs = {r["seed"]: r for r in records["adamw"]["runs"] if r["setting"] == published["id"]}
  assert runs[1001].get("stalled") is True
  want = min(
    [np.mean([runs[s]["final_raw"] for s in (1002, SPARE)])]
    + [np.mean([runs[s]["final_averaged"][str(b)] for s in (1002, SPARE)]) for b in search.AVERAGING_BETAS]
  )
  assert published["two_seed_mean"] == pytest.approx(want)


def test_a_knob_reads_its_range_and_its_edges():
  b2 = search.Knob("optim.b2", "log", (5e-5, 5e-2), below=2.5e-5, above=0.1, one_minus=True)
  assert b2.value(0.0) == pytest.approx(1 - 5e-5) and b2.value(0.999999) == pytest.approx(0.95, abs=1e-4)
  assert (
    b2.edge(0.95) == pytest.approx(0.9) and b2.edge(1 - 5e-5) == pytest.approx(1 - 2.5e-5) and b2.edge(0.99) is None
  )
  wd = search.Knob("optim.weight_decay", "zero_or_log", (0.01, 1.0), above=2.0)
  assert wd.value(0.2) == 0.0 and wd.value(0.5) == pytest.approx(0.01) and wd.edge(0.0) is None and wd.edge(0.9) == 2.0
  assert wd.edge(0.011) is None  # the range's low end is no edge: 0 lies below it
  b1 = search.Knob("optim.b1", "choice", (0.8, 0.9, 0.95), below=0.7, above=0.98)
  assert [b1.value(u) for u in (0.0, 0.4, 0.9)] == [0.8, 0.9, 0.95] and b1.edge(0.9) is None and b1.edge(0.8) == 0.7


@pytest.mark.slow  # scipy.stats's import (seconds)
def test_the_sobol_points_are_the_seeds_and_fill_the_cube():
  points = search.sobol_points(5, 0)
  assert points.shape == (search.SOBOL_POINTS, 5) and np.array_equal(points, search.sobol_points(5, 0))
  assert not np.array_equal(points, search.sobol_points(5, 1))
  assert points.min() >= 0 and points.max() < 1
  # a (0, m, d)-net: each half of every axis holds half of the points
  assert all(np.sum(points[:, k] < 0.5) == search.SOBOL_POINTS // 2 for k in range(5))


def test_the_cosine_schedule_leaves_the_cool_down_at_its_default():
  _, adamw, _ = _configs()
  c = search.apply_setting(adamw, {"optim.schedule": "cosine", "optim.decay_fraction": 0.6})
  assert c.optim.decay_fraction == 0.2 and adamw.optim.decay_fraction == 0.4
  assert search.apply_setting(adamw, {"optim.decay_fraction": 0.6}).optim.decay_fraction == 0.6


def test_an_untied_muon_groups_row_is_refused_naming_the_field():
  _, _, muon = _configs()
  muon.model.untied_head = True
  with pytest.raises(ValueError, match=r"model\.untied_head=True.*tied_"):
    search.space_of(muon, 4)


def test_the_warm_ups_offered_are_shorter_than_the_sides_shortest_budget():
  _, adamw, muon = _configs()
  warmups = lambda space: next(k for k in space if k.field == "optim.warmup_steps")  # noqa: E731
  assert warmups(search.space_of(adamw, 4)).values == (0, 4, 12) and warmups(search.space_of(adamw, 4)).above == 24
  short = warmups(search.space_of(muon, 4, shortest=10))
  assert short.values == (0, 4) and short.above is None and short.edge(4) is None
