"""The joint search (`bench.search`) on stub runs (nothing trains): both sides searched alike, at equal
cost, never on a headline seed, a stalled run re-run on the spare seed and not ranked."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import search, speedrun, tuning

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
  """A loss quadratic in log LR around the side's best LR, lower with b1 0.95 (AdamW) or with a higher
  momentum (Muon: past its range's edge too, so the bracketing steps on), plus 0.01 per seed; AdamW's published setting
  stalls on seed 1001 (its curve ten times as high at N/10 and at N)."""
  c = spec["config"]
  o, n = c["optim"], c["trainer"]["steps"]
  lr = o["learning_rate"]
  loss = 2.5 + 0.3 * math.log(lr / BEST_LR[o["name"]]) ** 2 + 0.01 * (c["seed"] - 1000)
  loss -= 0.05 * (o["b1"] == 0.95) if o["name"] == "adamw" else 0.05 * (o["muon_momentum"] - 0.9) / 0.08
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
  assert adamw["refine"][0]["rounds"][0]["lr"]["moves"] <= search.LR_MOVES
  # Muon's momentum at 0.98, its range's edge, is stepped past (0.99, 0.995: the stub's gain holds, beyond
  # the noise, so each is kept, up to the last step, its hard edge).
  momentum = muon["edges"]["knobs"]["optim.muon_momentum"]
  assert momentum["edge"] == "high" and len(momentum["tried"]) == 2 and momentum["kept"] == 0.995
  assert muon["fields"]["optim.muon_momentum"] == 0.995
  assert muon["edges"]["knobs"]["optim.schedule"]["stopped"] == "categorical"
  # The averaged iterate at 0.995 reads lowest in the stub.
  assert (adamw["iterate"], adamw["beta"]) == ("averaged", 0.995)


@pytest.mark.slow  # scipy.stats's import and about 300 run specs (seconds)
def test_the_chosen_combination_is_run_as_chosen_and_the_record_keeps_the_cost_curve(searched):
  _, records, _ = searched
  for rec in records.values():
    chosen = rec["chosen"]
    as_run = next(s for s in rec["settings"] if s["id"] == chosen["as_chosen"])
    assert as_run["config"] == chosen["fields"] and as_run["three_seed_mean"] is not None
    # the raw iterate's setting, searched alike and read raw
    assert rec["raw_chosen"]["iterate"] == "raw" and rec["raw_chosen"]["reading"] == ["raw", None]
    costs, best = zip(*rec["tuning_curve"])
    assert list(costs) == sorted(costs) and costs[-1] == rec["search_runs"]
    assert all(b <= a for a, b in zip(best, best[1:]) if a is not None)
    check = rec["saturation"]["check"]
    assert check["saturated"] == (check["improvement"] <= check["se_two_seed_mean"])
    assert rec["space_name"] == "symmetric" and rec["asymmetry"] == search.SPACES["symmetric"]


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


def test_a_knob_reads_its_range_and_its_further_steps():
  b2 = search.Knob("optim.b2", "log", (5e-5, 5e-2), below=(2.5e-5, 1.25e-5), above=(0.1, 0.2), one_minus=True)
  assert b2.value(0.0) == pytest.approx(1 - 5e-5) and b2.value(0.999999) == pytest.approx(0.95, abs=1e-4)
  steps, edge = b2.beyond(0.95)
  assert edge == "high" and steps == pytest.approx([0.9, 0.8])
  assert b2.beyond(1 - 5e-5)[0] == pytest.approx([1 - 2.5e-5, 1 - 1.25e-5]) and b2.beyond(0.99) == ([], "inside")
  assert b2.beyond(0.9) == ([0.8], "high")  # a step kept goes on with the steps past it
  assert b2.beyond(0.8) == ([], "hard edge")
  wd = search.Knob("optim.weight_decay", "zero_or_log", (0.01, 1.0), above=(2.0,))
  assert wd.value(0.2) == 0.0 and wd.value(0.5) == pytest.approx(0.01) and wd.beyond(0.0) == ([], "domain edge")
  assert wd.beyond(0.9) == ([2.0], "high") and wd.beyond(0.011) == ([], "inside")  # 0 lies below its log range
  b1 = search.Knob("optim.b1", "choice", (0.8, 0.9, 0.95), below=(0.7, 0.6), above=(0.98,))
  assert [b1.value(u) for u in (0.0, 0.4, 0.9)] == [0.8, 0.9, 0.95] and b1.beyond(0.9) == ([], "inside")
  assert b1.beyond(0.8) == ([0.7, 0.6], "low") and b1.beyond(0.7) == ([0.6], "low")
  floor = search.Knob("optim.min_lr_ratio", "choice", (0.0, 0.1, 0.3), above=(0.5,))
  assert floor.beyond(0.0) == ([], "domain edge") and floor.beyond(0.3) == ([0.5], "high")
  assert search.Knob("optim.schedule", "category", ("wsd", "cosine")).beyond("cosine") == ([], "categorical")


def test_every_ordered_knob_declares_at_most_lr_moves_further_steps():
  _, adamw, muon = _configs()
  muon.model.untied_head = True
  for space in (search.space_of(adamw, 4, space="v1"), search.space_of(adamw, 4), search.space_of(muon, 4)):
    for k in space:
      assert len(k.below) <= search.LR_MOVES and len(k.above) <= search.LR_MOVES, k.field
      assert k.kind != "category" or not (k.below or k.above), k.field


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


def test_an_untied_muon_groups_row_is_refused_by_space_v1_and_searched_symmetrically():
  _, adamw, muon = _configs()
  muon.model.untied_head = True
  with pytest.raises(ValueError, match=r"model\.untied_head=True.*'v1'.*tied_.*'symmetric'"):
    search.space_of(muon, 4, space="v1")
  fields = [k.field for k in search.space_of(muon, 4)]
  ratios = ("optim.embed_lr_ratio", "optim.head_lr_ratio", "optim.scalar_lr_ratio")
  assert all(f in fields for f in ratios + ("optim.groups_b1", "optim.groups_b2"))
  assert not any(f.startswith("optim.tied_") for f in fields)
  # AdamW's ratios continuous over the same x/÷ 4 as Muon's; its three-valued one in space 'v1' alone
  v1 = {k.field: k for k in search.space_of(adamw, 4, space="v1")}
  assert v1["optim.adamw_embed_lr_ratio"].values == (0.5, 1.0, 2.0)
  sym = {k.field: k for k in search.space_of(adamw, 4)}
  r = float(adamw.optim.adamw_embed_lr_ratio)
  assert sym["optim.adamw_embed_lr_ratio"].kind == "log" and sym["optim.adamw_embed_lr_ratio"].values == (r / 4, r * 4)
  adamw.model.untied_head = True
  assert "optim.adamw_head_lr_ratio" in [k.field for k in search.space_of(adamw, 4)]
  # the v1 space's Sobol draw is the published cell's: the same knobs, in the same order, of the same values
  assert [(k.field, k.values) for k in v1.values()][:5] == [
    ("optim.learning_rate", (0.003, 0.048)),
    ("optim.b1", (0.8, 0.9, 0.95)),
    ("optim.b2", (5e-5, 5e-2)),
    ("optim.weight_decay", (0.01, 1.0)),
    ("optim.adamw_embed_lr_ratio", (0.5, 1.0, 2.0)),
  ]


def test_the_warm_ups_offered_are_shorter_than_the_sides_shortest_budget():
  _, adamw, muon = _configs()
  warmups = lambda space: next(k for k in space if k.field == "optim.warmup_steps")  # noqa: E731
  full = warmups(search.space_of(adamw, 4))
  assert full.values == (0, 4, 12) and full.above == (24, 48)
  short = warmups(search.space_of(muon, 4, shortest=10))
  assert short.values == (0, 4) and short.above == () and short.beyond(4) == ([], "hard edge")


def _b1_stub(gain: float):
  """A loss lower by `gain` per 0.1 of beta1 below 0.8, each seed off by +-0.01 there (the noise)."""

  def stub(spec):
    c = spec["config"]
    b1, n = c["optim"]["b1"], c["trainer"]["steps"]
    below = b1 < 0.8
    loss = 2.5 - gain * round((0.8 - b1) / 0.1) * below + {1001: 0.01, 1002: -0.01, 1003: 0.0}[c["seed"]] * below
    curve = [{"step": n // 10, "eval_loss_raw": loss}, {"step": n, "eval_loss_raw": loss}]
    averaged = {str(b): loss for b in spec["betas"]}
    return {"seed": c["seed"], "steps": n, "lr": 0.01, "curve": curve, "final_raw": loss, "final_averaged": averaged}

  return stub


@pytest.mark.parametrize("gain, kept", [(0.002, None), (0.05, 0.4)])
def test_a_step_past_an_edge_is_kept_only_while_it_wins_beyond_the_noise(gain, kept):
  """A gain within the seeds' noise of the difference is not kept; one beyond it steps on, at most
  `LR_MOVES` steps (beta1's last, 0.4, its hard edge)."""
  _, adamw, _ = _configs()
  side = search.Search("adamw", adamw, search.space_of(adamw, 4), SEEDS, SPARE, 0, 0.05)
  runner = SpecRunner(_b1_stub(gain))
  base = side.add("base", search.published_setting(adamw, side.space) | {"optim.b1": 0.8})
  search.run_requests([(side, base, s) for s in SEEDS], runner, "base")
  out = search.bracket(search.Finishing(side, runner, ("raw", None), math.inf), base)
  b1 = out["knobs"]["optim.b1"]
  assert b1["edge"] == "low" and b1["kept"] == kept and out["kept"].get("optim.b1") == kept
  assert len(b1["tried"]) == (1 if kept is None else search.LR_MOVES)
  assert b1["stopped"] == ("within noise" if kept is None else "at most LR_MOVES moves")


def test_a_win_counts_only_beyond_the_noise_of_the_paired_difference():
  assert tuning.wins_beyond_noise([1.0, 1.0, 1.0], [1.1, 1.1, 1.1])["wins"]
  small = tuning.wins_beyond_noise([1.0, 1.2, 1.1], [1.1, 1.1, 1.15])
  assert small["difference"] < 0 and not small["wins"] and small["se"] > -small["difference"]
  assert not tuning.wins_beyond_noise([1.0], [2.0])["wins"]  # one seed cannot tell the noise


def test_a_budget_check_switches_only_where_a_candidate_wins_beyond_the_paired_noise():
  tried = [t | {"losses": []} for t in tuning.budget_candidates(0.01, 0.1, 2.0)]
  assert [(t["lr"], t["weight_decay"]) for t in tried] == [(0.01, 0.1), (0.007071, 0.1), (0.01414, 0.1), (0.01, 0.05)]
  assert len(tuning.budget_candidates(0.01, 0.0, 2.0)) == 3  # no weight decay to move
  tried[0]["losses"], tried[1]["losses"], tried[2]["losses"] = [2.0, 2.1, 2.2], [2.02, 2.12, 2.22], [2.1, 2.2, 2.3]
  tried[3]["losses"] = [1.99, 2.05, 2.23]  # the lowest mean, but within the paired noise: kept as chosen
  assert tuning.budget_choice(tried)["chosen"] == {"lr": 0.01, "weight_decay": 0.1}
  tried[3]["losses"] = [1.98, 2.08, 2.19]  # beyond it: the weight decay moves
  assert (
    tuning.budget_choice(tried)["chosen"]["weight_decay"] == 0.05
    and tuning.budget_choice(tried)["best_difference"]["wins"]
  )


def test_each_new_optimizers_space_is_found_by_its_name_and_centred_with_its_reason():
  """`space_of` finds `<name>_space` with its declared `Centre` (no table of names): Lion's LR 3-10x below
  AdamW's and its weight decay 3-10x above; schedule-free's without the schedule's knobs (named among what
  it lacks) and its rate held after the warm-up; an optimizer with no space is refused by name."""
  _, adamw, _ = _configs()
  lr, wd = float(adamw.optim.learning_rate), float(adamw.optim.weight_decay)
  for name in ("nadamw", "lion", "schedule_free_adamw"):
    centre = search.space_function(name).centre
    assert centre.why and search.space_function(name) is getattr(search, f"{name}_space")
    c = search.centred(adamw, name)
    assert c.optim.name == name and c.optim.learning_rate == tuning.round_lr(lr * centre.lr)
    assert c.optim.weight_decay == tuning.round_lr(wd * centre.weight_decay)
    fields = [k.field for k in search.space_of(c, 4)]
    assert fields[0] == "optim.learning_rate" and "optim.weight_decay" in fields and len(set(fields)) == len(fields)
    assert search.weight_decay_field(c) == "optim.weight_decay"
  lion = search.lion_space.centre
  assert 1 / 10 <= lion.lr <= 1 / 3 and 3 <= lion.weight_decay <= 10
  assert {"optim.lion_b1", "optim.lion_b2"} <= {k.field for k in search.space_of(search.centred(adamw, "lion"), 4)}
  free = search.centred(adamw, "schedule_free_adamw")
  assert free.optim.min_lr_ratio == 1.0 and search.owns_schedule(free)
  free_fields = {k.field for k in search.space_of(free, 4)}
  assert not free_fields & {
    "optim.schedule",
    "optim.min_lr_ratio",
    "optim.decay_fraction",
    "optim.adamw_embed_lr_ratio",
  }
  assert any(x.startswith("schedule") for x in search.schedule_free_adamw_space.centre.lacks)
  assert search.weight_decay_field(speedrun.apply_tricks(adamw, ["muon"])) in (None, "optim.muon_weight_decay")
  sgd = search.apply_setting(adamw, {"optim.name": "sgd"})
  with pytest.raises(ValueError, match=r"--config\.optim\.name='sgd': the joint search has a space for adamw, .*lion"):
    search.space_of(sgd, 4)


def test_a_user_modules_space_becomes_knobs_in_its_block():
  """A module's AlgoPerf-shaped SPACE: a log or linear range, feasible points as ordered choices; its knobs
  set in `optim.module`, the LR as the schedule's peak; its weight decay the one `refine` moves."""
  _, adamw, _ = _configs()
  c = search.centred(adamw, "experiments.cautious_adamw")
  knobs = {k.field: k for k in search.space_of(c, 4)}
  assert knobs["optim.learning_rate"].kind == "log" and knobs["optim.module.b1"].values == (0.8, 0.9, 0.95)
  assert search.weight_decay_of(c) == ("optim.module.weight_decay", float(adamw.optim.weight_decay))
  assert search.apply_setting(c, {"optim.module.b1": 0.8}).optim.module.b1 == 0.8
  # the shared knobs, as every side's, but clipping (the module's own chain clips, or does not)
  assert "optim.warmup_steps" in knobs and "optim.schedule" in knobs and "optim.grad_clip" not in knobs
  linear = search.Knob("optim.module.x", "linear", (1.0, 3.0))
  assert linear.value(0.5) == 2.0 and linear.beyond(2.9) == ([], "hard edge") and linear.beyond(2.0) == ([], "inside")


def test_a_side_moved_from_the_reference_keeps_what_it_shares_and_resets_what_it_does_not_read():
  """The reference's embedding LR ratio (2.0) is kept by Lion, which declares it, and reset to its default by
  schedule-free AdamW, which has none (its averaging weights depend on the LR); the schedule's fields are kept."""
  _, adamw, _ = _configs()
  adamw.optim.adamw_embed_lr_ratio = 2.0
  assert search.centred(adamw, "lion").optim.adamw_embed_lr_ratio == 2.0
  free = search.centred(adamw, "schedule_free_adamw")
  assert free.optim.adamw_embed_lr_ratio == 1.0 and free.optim.warmup_steps == adamw.optim.warmup_steps
  assert free.optim.b2 == adamw.optim.b2
