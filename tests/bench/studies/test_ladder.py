"""The fairness ladder's pure parts (`hybridjax/bench/studies/ladder/`): each rung's baseline condition, the
plateau flags, the R0 nulls and the checks on its fields. The ladder run itself is tested on the
quick protocol's runs in tests/bench/test_benchmark.py."""

from __future__ import annotations

import functools
import glob
import json
import math
import os

import chex
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import ROOT

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import optim
from hybridjax.bench import cells, figures, protocol, record, specs, speedrun, studies, study, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.studies.ladder import figures as ladder_figs
from hybridjax.bench.studies.ladder import report as ladder_report
from hybridjax.bench.studies.ladder import run as ladder_run
from hybridjax.bench.studies.ladder import rungs as ladder_rungs
from hybridjax.bench.studies.recipe import figures as recipe_figs
from hybridjax.bench.studies.recipe import report as recipe_report
from hybridjax.bench.studies.recipe import run as recipe_run


def _config():
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "ladder"
  return c


def test_constant_rungs_hold_the_lr_after_warmup_and_r5_is_muon():
  c = _config()
  n = int(c.trainer.steps)
  for group, peak in (("untuned", c.benchmark.ladder.untuned_lr), ("constant", 0.004)):
    g = ladder_rungs.group_config(c, group, [1, 2])
    g.optim.learning_rate = peak
    for total in (n, 2 * n):  # a constant schedule does not depend on the budget
      schedule = optim.make_schedule(g.optim, total)
      lrs = jnp.array([optim.learning_rate(schedule, jnp.asarray(t)) for t in range(g.optim.warmup_steps, total)])
      chex.assert_trees_all_close(lrs, jnp.full_like(lrs, peak), rtol=1e-6)
    assert g.benchmark.family == "adamw-constant" and list(g.benchmark.seeds) == [1, 2]
  cosine = ladder_rungs.group_config(c, "cosine", [1, 2])
  assert cosine.optim.min_lr_ratio == c.optim.min_lr_ratio < 1.0
  muon = ladder_rungs.group_config(c, "muon", [3])
  assert muon.optim.name == "muon" and muon.optim.learning_rate == c.benchmark.ladder.muon.learning_rate
  assert muon.benchmark.family == "muon-cosine"


class _LogDistanceRunner:
  """Trains nothing: a run's raw loss at N is its LR's distance in log from `best` (the seed adds a hair)."""

  def __init__(self, best: float):
    self.best, self.ran = best, []

  def run(self, specs_: list, label: str) -> list:
    self.ran += [(s["config"]["seed"], s["config"]["optim"]["learning_rate"]) for s in specs_]
    return [{"final_raw": abs(math.log(lr / self.best)) + 1e-4 * seed} for seed, lr in self.ran[-len(specs_) :]]


def test_r2_sweeps_up_from_the_untuned_lr_and_extends_while_the_best_is_at_the_edge():
  c = ladder_rungs.group_config(_config(), "constant", [1, 2])
  c.benchmark.update(lr_points=3, lr_max_extensions=3)
  runner = _LogDistanceRunner(best=3e-3)
  sweep = ladder_run.constant_sweep(c, runner)
  grid = [0.001, 0.001414, 0.002, 0.002828, 0.003999]  # from the untuned LR up; two extensions from the edge
  assert c.benchmark.ladder.untuned_lr == grid[0] and sweep["grid"] == grid and not sweep["best_at_edge"]
  assert runner.ran == [(1001, lr) for lr in grid] + [(1002, 0.002828), (1002, 0.003999)]
  assert sweep["best_lr"] == 0.002828 and list(sweep["best_two_means"]) == ["0.002828", "0.003999"]
  assert sweep["raw_loss"] == [pytest.approx(abs(math.log(lr / 3e-3)) + 0.1001) for lr in grid]


def test_the_forecaster_arms_run_at_the_cosine_rungs_only():
  c = benchmark_cfg.get_config("long")
  assert "jump_forecast" not in ladder_rungs.arms_at(c, "untuned") and "jump_forecast" in ladder_rungs.arms_at(
    c, "cosine"
  )
  assert ladder_rungs.arms_at(c, "constant") == ladder_rungs.names(c.benchmark.ladder.methods)


def _curve(values, n=100):
  return [{"step": s, "eval_loss_raw": v} for s, v in zip((n // 10, n // 2, n), values)]


def test_a_run_far_above_its_groups_median_early_or_at_n_is_a_plateau():
  n = 100
  base = {"steps": [], "raw": []}
  group = {
    "baseline": {str(s): base | {"n_run_curve": _curve([2.5, 2.0, 1.8])} for s in (1, 2, 3)},
    "method_runs": {
      "arm": {
        "1": {"curve": _curve([2.5, 2.0, 1.79])},
        "2": {"curve": _curve([2.72, 2.2, 1.80])},  # stuck early, recovered by N
        "3": {"curve": _curve([2.5, 2.1, 1.99])},  # ends far behind
      }
    },
  }
  flagged = ladder_run.plateaus(group, n, margin=0.05)
  assert {(p["run"], p["seed"], p["at_step"]) for p in flagged} == {("arm", "2", 10), ("arm", "3", 100)}
  assert ladder_run.plateaus(group, n, margin=0.2) == []


def _group(method_losses, stop_losses_at, n=100):
  """Constant-LR baseline curves (raw = averaged) per seed, and one arm with its control."""
  steps = [10, 20, 40, 60, 80, 100, 150, 200]
  curve = [3.0, 2.6, 2.3, 2.15, 2.05, 2.0, 1.9, 1.85]
  baseline = {
    s: {"steps": steps, "raw": [x + d for x in curve], "averaged": curve}
    for s, d in (("1", 0.0), ("2", 0.01), ("3", -0.01))
  }
  kinds = {"full_step": 60, "predict_step": 40}
  runs = {
    s: {"final_raw": loss, "final_averaged": loss, "backward_passes": 60, "validation_forwards": 0, "step_kinds": kinds}
    for s, loss in zip(("1", "2", "3"), method_losses)
  }
  control = {
    s: r | {"final_raw": stop_losses_at[s] + 0.001 * i, "final_averaged": stop_losses_at[s]}
    for i, (s, r) in enumerate(runs.items())
  }
  return {"baseline": baseline, "method_runs": {"arm": runs, "arm_control": control}}


def test_r0_credits_a_gain_only_beyond_both_nulls():
  n = 100
  ms = {"baseline": {"baseline": 10.0}, "arm": {"full_step": 10.0, "predict_step": 2.0}}
  rung = ladder_rungs.RUNGS["R0"]
  stop = {
    s: protocol.curve_loss_at(b["steps"], b["raw"], 60)
    for s, b in _group([0, 0, 0], {"1": 0, "2": 0, "3": 0})["baseline"].items()
  }
  # An arm whose loss is the baseline's stopped at its 60 backward passes: the seed's criterion may
  # call it a speed-up, but it is no better than stopping early.
  same = _group([stop[s] for s in ("1", "2", "3")], stop)
  f = ladder_figs.arm_figures(rung, same, "arm", "arm_control", ms, n)
  e = f["equal_steps"]
  assert e["wallclock_ratio"]["mean"] == pytest.approx(n * 10.0 / (60 * 10.0 + 40 * 2.0))
  np.testing.assert_allclose(e["null_stopped_baseline"]["loss"], [stop[s] for s in ("1", "2", "3")])
  assert e["null_stopped_baseline"]["wallclock_ratio"]["mean"] == pytest.approx(n / 60)
  assert e["vs_stopped_baseline"]["verdict"] == "no difference" and not e["claim"]["beats_both_nulls"]
  # An arm clearly below both nulls on every seed is credited.
  better = _group([stop[s] - 0.1 - 0.002 * i for i, s in enumerate(("1", "2", "3"))], stop)
  e = ladder_figs.arm_figures(rung, better, "arm", "arm_control", ms, n)["equal_steps"]
  assert e["vs_stopped_baseline"]["verdict"] == "lower" and e["vs_control"]["verdict"] == "lower"
  assert e["claim"]["beats_both_nulls"]


def test_the_iterate_of_a_rung_is_compared_with_the_same_iterate():
  n = 100
  g = _group([2.0, 2.01, 1.99], {"1": 2.1, "2": 2.1, "3": 2.1})
  for r in g["method_runs"]["arm"].values():
    r["final_averaged"] = r["final_raw"] - 0.05
  raw = ladder_figs.arm_figures(ladder_rungs.RUNGS["R3"], g, "arm", None, None, n)
  avg = ladder_figs.arm_figures(ladder_rungs.RUNGS["R4"], g, "arm", None, None, n)
  assert raw["loss"] == [2.0, 2.01, 1.99] and avg["loss"] == pytest.approx([1.95, 1.96, 1.94])
  assert raw["baseline_at_n"] == pytest.approx([2.0, 2.01, 1.99]) and avg["baseline_at_n"] == pytest.approx([2.0] * 3)
  assert raw["vs_baseline_at_n"]["verdict"] == "no difference"
  assert raw["wallclock_ratio"]["n_null"] == 3  # no timing given: no wall-clock figure, never a guess


def test_bad_ladder_settings_name_the_field():
  c = _config()
  c.benchmark.ladder.update(rungs="R1,R9", methods="jump,nope")
  with pytest.raises(ValueError) as e:
    study.validate(c)
  for text in ("--config.benchmark.ladder.rungs='R1,R9'", "--config.benchmark.ladder.methods names ['nope']"):
    assert text in str(e.value)
  c = _config()  # the plateau rule's fields: every protocol's check (the ladder's and the recipe's)
  c.benchmark.plateau_seeds = (1,)
  with pytest.raises(ValueError, match="benchmark.plateau_seeds must not repeat a headline"):
    specs.validate_benchmark(c)


PUBLISHED = os.path.join(ROOT, "docs", "results")


def _published():
  paths = sorted(glob.glob(os.path.join(PUBLISHED, "ladder", "ladder-*.json")))
  assert paths, "docs/results/ladder/ holds no published ladder-<preset>.json"
  out = {}
  for path in paths:
    with open(path) as f:
      out[path] = json.load(f)
  return out


def test_the_published_ladders_recompute_from_their_runs():
  """Every figure of every published ladder, recomputed from the runs stored beside it; its tables
  are the report's; the headline scale ran every rung with at least 3 headline seeds."""
  results = _published()
  presets = {r["preset"]: r for r in results.values()}
  # R6 (the speedrun recipe) ran later and was joined in (`ladder_run.join`): every rung, in order.
  assert "long" in presets and presets["long"]["rung_names"] == list(ladder_rungs.RUNGS)
  for path, r in results.items():
    config = record.stored_config(r)  # an old record's flat study fields too
    ms = {k: v["ms_per_step"] for k, v in r["timing"].items()}
    rounds = {k: v.get("rounds_ms") for k, v in r["timing"].items()}  # none before they were kept
    again = ladder_figs.rung_figures(config, r["groups"], ms, r["steps"], rounds)
    assert json.loads(json.dumps(again)) == r["rungs"], path
    for name in r["rung_names"]:
      assert len(r["rungs"][name]["seeds"]) >= 3, (path, name)
    with open(path[: -len(".json")] + ".md") as f:
      assert f.read() == ladder_report.ladder_markdown(r) + "\n", path
    assert os.path.getsize(path[: -len(".json")] + ".png") > 1000


def test_the_published_recipes_recompute_from_their_runs():
  """Every figure of every published recipe, recomputed from the runs stored in it; its report is the
  report's; every trick of the list it was measured with is a step, each with at least 3 headline
  seeds, and the fields the json promises are there."""
  paths = sorted(glob.glob(os.path.join(PUBLISHED, "recipe", "recipe-*.json")))
  kept = sorted(glob.glob(os.path.join(PUBLISHED, "recipe", "trick-list-*-recipe-*.json")))  # replaced ones
  assert kept
  paths += kept
  presets = {}
  for path in paths:
    with open(path) as f:
      r = json.load(f)
    if path not in kept:
      presets[r["preset"]] = r
    again = json.loads(json.dumps(recipe_figs.recipe_figures(r)))
    assert again == {k: r[k] for k in ("figures", "total_speedup")}, path
    # No trick dropped, in the record's order, each as the list it was measured with describes it
    # (the published recipes hold no `trick_list`: the first list, `speedrun.TRICKS_V1`).
    tricks = speedrun.trick_list(r)
    assert r["tricks"] == list(tricks), path
    assert r["records"] == {name: trick.record for name, trick in tricks.items()}, path
    for row in r["figures"]:
      assert {"name", "speedup", "seeds", "wallclock_ratio", "vs_previous"} <= set(row)
      assert row["name"] == "anchor" or "lr" in row
      assert set(row["speedup"]) >= {"mean", "std", "per_seed"} and len(row["seeds"]) >= 3, (path, row["name"])
    last = r["figures"][-1]
    assert r["total_speedup"] == {"name": last["name"], **last["speedup"], "wallclock_ratio": last["wallclock_ratio"]}
    with open(path[: -len(".json")] + ".md") as f:
      assert f.read() == recipe_report.recipe_markdown(r) + "\n", path
    assert os.path.getsize(path[: -len(".json")] + ".png") > 1000
  assert "long" in presets, "docs/results/recipe/ holds no published recipe-long.json"


def test_the_published_protocol_results_are_the_ladders_own_runs():
  """docs/results/<preset>-<family> of the cosine families hold the very runs the ladder's R3-R5 read."""
  for r in _published().values():
    for group in ("cosine", "muon"):
      if group not in r["groups"]:
        continue
      g = r["groups"][group]
      with open(os.path.join(PUBLISHED, f"{r['preset']}-{g['family']}", "benchmark.json")) as f:
        stored = json.load(f)
      for s, base in g["baseline"].items():
        assert stored["curves"]["baseline"][s] == base["raw"]
        assert stored["curves"]["averaged_baseline"][s] == base["averaged"]
      for m, runs in g["method_runs"].items():
        for s, run in runs.items():
          assert stored["method_runs"][m][s]["final_raw"] == run["final_raw"], (m, s)


def test_every_rung_reports_and_draws_with_an_arm_without_control_and_without_timing(tmp_path):
  """The report and the figure over all six rungs on synthetic groups: an arm with a control, one
  without (R0 compares it with the stopped baseline alone), and a muon group with no timing."""
  c = benchmark_cfg.get_config("long")
  c.benchmark.study = "ladder"
  n = 100
  stop = {"1": 2.3, "2": 2.3, "3": 2.3}
  groups = {}
  for g in ("untuned", "constant", "cosine", "muon", "speedrun"):
    group = _group([2.0, 2.01, 1.99], stop)
    if g == "speedrun":
      group["tuning"] = {"iterate": "raw"}  # R6 reads the iterate its tuning chose
    runs = group["method_runs"]
    group["method_runs"] = {"jump": runs["arm"], "skip_control": runs["arm_control"], "outer_momentum": runs["arm"]}
    group.update(methods=list(group["method_runs"]), lr=1e-3, seeds=[1, 2, 3], beta=0.99, family=g, plateaus=[])
    groups[g] = group
  ms = {"adamw": {"baseline": {"baseline": 10.0}, "jump": {"full_step": 10.0, "predict_step": 2.0}}}
  ms["adamw"]["outer_momentum"] = ms["adamw"]["jump"]
  rungs = ladder_figs.rung_figures(c, groups, ms, n)
  assert list(rungs) == list(ladder_rungs.RUNGS) and rungs["R5"]["figures"]["jump"]["wallclock_ratio"]["n_null"] == 3
  assert rungs["R6"]["iterate"] == "raw" and rungs["R6"]["verdict_rung"]
  assert rungs["R0"]["figures"]["outer_momentum"]["equal_steps"]["claim"]["nulls_compared"] == ["stopped_baseline"]
  result = {
    "preset": "synthetic",
    "task": "gpt2",
    "steps": n,
    "command": "test",
    "wall_s": 7.0,
    "runs_trained": 1,
    "runs_cached": 2,
    "machine": {"cpu_cores": 2, "platform": "cpu"},
    "rung_names": list(ladder_rungs.RUNGS),
    "verdict_rungs": list(ladder_rungs.VERDICT),
    "rungs": rungs,
    "groups": groups,
    "untuned_position": {},
  }
  md = ladder_report.ladder_markdown(result)
  for name in ladder_rungs.RUNGS:
    assert f"## {name}: " in md
  assert "the stopped baseline (no control)" in md and "R4: R3 with weight averaging (averaged) **verdict**" in md
  assert ladder_report.save_ladder_plot(result, str(tmp_path)).endswith("ladder-synthetic.png")


def test_a_recipe_step_reads_its_speedup_on_the_anchors_curve():
  """The recipe's figures on a synthetic anchor: a loss on the curve reads the interpolated steps, one
  below its end a lower bound ('> x'), and each step is paired with the one before it."""
  anchor = {s: {"steps": [50, 100, 200, 400], "loss": [3.0, 2.0, 1.5, 1.2]} for s in ("1", "2", "3")}
  step = {"runs": {"1": {"loss": 1.5}, "2": {"loss": 2.0}, "3": {"loss": 1.1}}}
  previous = {"1": 2.0, "2": 2.1, "3": 1.9}
  f = recipe_figs.step_figures("x", step, previous, anchor, {"anchor": 10.0, "x": 20.0}, 100)
  assert f["speedup"]["per_seed"] == [2.0, 1.0, 4.0] and f["speedup"]["lower_bound"]
  assert f["wallclock_ratio"]["mean"] == pytest.approx(f["speedup"]["mean"] / 2)
  assert f["vs_previous"]["differences"] == pytest.approx([-0.5, -0.1, -0.8])
  assert cells.speedup_cell(f["speedup"]).startswith("> ")


def test_a_published_scale_names_the_runs_it_read_from_the_cache():
  """A ladder or recipe resumed from runs an earlier, stopped invocation trained says so: their
  compute is not in its hours."""
  machine = {"cpu_cores": 2, "platform": "cpu"}
  calls = [
    {"wall_s": 3600.0, "runs_trained": 5, "runs_cached": 0},
    {"wall_s": 1800.0, "runs_trained": 2, "runs_cached": 3},
  ]
  assert cells.compute_clause({"machine": machine, "invocations": calls}) == (
    "7 runs trained in 1.5 h over 2 invocation(s) on 2 cpu cores, 3 more read from the run cache"
  )
  alone = {"machine": machine, "wall_s": 720.0, "runs_trained": 4, "runs_cached": 0}
  assert cells.compute_clause(alone) == "4 runs trained in 0.2 h over 1 invocation(s) on 2 cpu cores"


def test_the_recipe_flags_an_anchor_run_on_a_plateau_and_adds_seeds_that_keep_every_key():
  """The recipe's plateau rule on the anchor's N-step runs (one seed stuck at N/10), and the config
  with the added seeds: a run's spec holds no benchmark field, so every run already trained keeps its
  cache key."""
  n = 100
  runs = {f"{s}/{n}": {"steps": n, "curve": _curve([2.5, 2.0, 1.8])} for s in ("1", "2")}
  runs["3/100"] = {"steps": n, "curve": _curve([2.9, 2.0, 1.8])}  # stuck early, recovered by N
  runs["3/200"] = {"steps": 200, "curve": _curve([9.0])}  # another budget: not an N-step run
  flagged = recipe_run.anchor_plateaus({"runs": runs}, n, margin=0.05)
  assert [(p["run"], p["seed"], p["at_step"]) for p in flagged] == [("anchor", "3", 10)]
  c = benchmark_cfg.get_config("quick")
  more = studies.copied(c, {"benchmark.seeds": (1, 2, 4, 5)})
  assert tuple(more.benchmark.seeds) == (1, 2, 4, 5) and tuple(c.benchmark.seeds) != (1, 2, 4, 5)
  spec = functools.partial(specs.run_spec, kind="anchor", seed=4, lr=1e-3, steps=40, beta=0.9)
  assert keys.run_key(spec(more)) == keys.run_key(spec(c))


def test_the_tiny_recipes_runs_sit_on_no_plateau():
  """The plateau rule on the first trick list's published `tiny` recipe, read from its committed run
  cache (each run's eval curve): no step's run and no anchor N-step run is flagged, so its three
  headline seeds stand."""
  path = os.path.join(PUBLISHED, "recipe", "trick-list-1-recipe-tiny.json")
  with open(path) as f:
    result = json.load(f)
  cache = os.path.join(PUBLISHED, "recipe", "tiny-run-cache")

  def curve(key):
    with open(os.path.join(cache, key + ".json")) as f:
      return json.load(f)["curve"]

  n, margin = result["steps"], result["config"]["benchmark"]["plateau_margin"]
  steps = {name: {s: curve(r["key"]) for s, r in st["runs"].items()} for name, st in result["step_runs"].items()}
  assert all(len(per_seed) == 3 for per_seed in steps.values())
  assert figures.plateau_runs(steps, n, margin) == []
  a = result["anchor"]  # its N-step runs: the cached runs at its LR, not a step's, whose averaged loss is its loss at N
  step_keys = {r["key"] for st in result["step_runs"].values() for r in st["runs"].values()}
  anchor = {}
  for name in sorted(os.listdir(cache)):
    with open(os.path.join(cache, name)) as f:
      run = json.load(f)
    s = str(run["seed"])
    if run["key"] in step_keys or run["steps"] != n or run["lr"] != a["lr"]:
      continue
    if tuning.averaged_loss(run, a["beta"]) == a["at_n"].get(s):
      assert s not in anchor, f"two cached runs match the anchor's seed {s} at N"
      anchor[s] = run["curve"]
  assert sorted(anchor) == sorted(a["at_n"]) == ["1", "2", "3"]
  assert figures.plateau_runs({"anchor": anchor}, n, margin) == []


def test_bad_recipe_settings_name_the_field_and_the_step(tmp_path):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "recipe"
  c.benchmark.recipe.tricks = "schedule,warp"
  with pytest.raises(ValueError, match=r"--config\.benchmark\.recipe\.tricks='schedule,warp'"):
    study.validate(c)
  c.benchmark.recipe.tricks = "schedule,unet"  # the micro model has one layer
  with pytest.raises(ValueError, match="(?s)step 'unet'.*model.unet_skips"):
    study.validate(c)
  c.benchmark.recipe.update(tricks="schedule", budgets=(1.5,))
  with pytest.raises(ValueError, match=r"--config\.benchmark\.recipe\.budgets"):
    study.validate(c)
  c = benchmark_cfg.get_config("quick")  # the plateau rule's fields: refused at the assignment
  with pytest.raises(ValueError, match=r"plateau_margin must be > 0"):
    c.benchmark.plateau_margin = 0.0
  c = ml_collections.ConfigDict(c.to_dict())  # a plain copy (a stored record's): the recipe refuses before writing
  c.benchmark.update(study="recipe", plateau_margin=0.0, plateau_seeds=(1,))
  with pytest.raises(ValueError, match=r"plateau_margin must be > 0.*plateau_seeds must not repeat a headline"):
    study.run(c, str(tmp_path / "recipe"))
  assert not (tmp_path / "recipe").exists()


def _split(result, rungs):
  """The part of a published ladder that ran `rungs` (its groups and timings), as one invocation."""
  part = json.loads(json.dumps(result))
  groups = {ladder_rungs.RUNGS[r].group for r in rungs}
  part["rung_names"] = list(rungs)
  part["verdict_rungs"] = [r for r in result["verdict_rungs"] if r in rungs]
  part["config"] = record.stored_config(result).to_dict()
  part["config"]["benchmark"]["ladder"]["rungs"] = ",".join(rungs)
  part["groups"] = {g: v for g, v in result["groups"].items() if g in groups}
  part["timing"] = {k: v for k, v in result["timing"].items() if k in {ladder_rungs.timing_key(g) for g in groups}}
  part["rungs"] = {r: result["rungs"][r] for r in rungs}
  part["invocations"] = [{"date": "d", "wall_s": 1.0, "runs_trained": 2, "runs_cached": 0}]
  part.update(wall_s=1.0, runs_trained=2, runs_cached=0, command=f"run {','.join(rungs)}")
  return part


def test_a_ladder_published_with_new_rungs_is_joined_with_the_published_one(tmp_path):
  """Publishing R6 alone into a folder whose ladder ran R0-R5 writes one ladder with every rung,
  each recomputed from the groups of both; a ladder that ran a rung again, or of another config, is
  refused: the published ladder stays as it was, the workdir keeps the new one."""
  (published,) = [r for r in _published().values() if r["preset"] == "long"]
  earlier, later = _split(published, list(ladder_rungs.RUNGS)[:-1]), _split(published, ["R6"])
  folder = tmp_path / "ladder"
  ladder_run.write(earlier, {"families": {}}, str(tmp_path / "work1"), str(folder))
  ladder_run.write(later, {"families": {}}, str(tmp_path / "work2"), str(folder))
  with open(folder / "ladder-long.json") as f:
    joined = json.load(f)
  assert joined["rung_names"] == list(ladder_rungs.RUNGS) and joined["rungs"] == published["rungs"]
  assert joined["command"] == "run R0,R1,R2,R3,R4,R5; run R6" and joined["runs_trained"] == 4
  assert [c["rungs"] for c in joined["invocations"]] == [list(ladder_rungs.RUNGS)[:-1], ["R6"]]
  assert joined["config"]["benchmark"]["ladder"]["rungs"] == ",".join(ladder_rungs.RUNGS)
  with open(tmp_path / "work2" / "ladder-long.json") as f:
    assert json.load(f)["rung_names"] == ["R6"]  # the workdir keeps what this invocation ran
  with pytest.raises(ValueError, match=r"ran \['R6', 'speedrun'\] already"):
    ladder_run.join(joined, later)
  with pytest.raises(ValueError, match="steps: 3000 there, 10 here"):
    ladder_run.join(earlier, {**later, "steps": 10})
  wider = json.loads(json.dumps(later))
  wider["config"]["model"]["d_model"] = 128
  with pytest.raises(ValueError, match="model.d_model: 64 there, 128 here"):
    ladder_run.join(earlier, wider)
  before = (folder / "ladder-long.json").read_bytes()
  for again, work in ((later, "work3"), (wider, "work4")):  # R6 again; another model
    with pytest.raises(ValueError, match=r"(?s)--config\.benchmark\.publish=.*delete .*ladder-long\.json deliberately"):
      ladder_run.write(again, {"families": {}}, str(tmp_path / work), str(folder))
    assert (folder / "ladder-long.json").read_bytes() == before  # nothing published
    assert (tmp_path / work / "ladder-long.json").exists()  # nothing computed is lost


def test_a_ladder_arm_with_fewer_than_3_jumps_per_run_reads_not_exercised():
  """ladder.json keeps each method run's own statistics (the accepted jumps); an arm at a rung whose runs
  took fewer than 3 jumps per run is marked in the headline cell, the rung's table and the verdict line;
  the published long ladder's R6 forecaster and outer-momentum jump arms (under 3 jumps a run) read so,
  and the tiny ladder's R6, whose jump schedule scales with N, marks none."""
  run = {
    "method": "jump",
    "seed": 1,
    "lr": 1e-3,
    "steps": 10,
    "final_raw": 2.0,
    "final_averaged": {"0.99": 2.0},
    "backward_passes": 10,
    "validation_forwards": 4,
    "step_kinds": {"real_step": 10},
    "curve": [],
    "jumps": 2,
    "jump_steps": 100,
    "method_stats": ["jumps", "jump_steps"],
  }
  kept = ladder_run.method_record(run)
  assert kept["jumps"] == 2 and kept["jump_steps"] == 100 and kept["method_stats"] == ["jumps", "jump_steps"]
  assert "jumps" not in ladder_run.method_record({k: v for k, v in run.items() if k not in ("jumps", "method_stats")})
  published = {r["preset"]: r for r in _published().values()}
  long, tiny = published["long"], published["tiny"]
  r6 = long["rungs"]["R6"]
  for arm in ("jump_forecast", "jump_outer"):
    f = r6["figures"][arm]
    assert f["exercise"]["exercised"] is False and f["exercise"]["jumps_per_run"] < figures.MIN_JUMPS_PER_RUN
    assert ladder_report.ladder_headline_cell(r6, f).endswith(f"; {cells.exercise_mark(f)}")
    per_run = f["exercise"]["jumps_per_run"]
    assert f"| {arm}, not exercised ({per_run:.1f} jumps per run) |" in ladder_report.ladder_markdown(long)
  assert r6["figures"]["jump"]["exercise"]["exercised"] and "exercise" not in r6["figures"]["outer_momentum"]
  verdicts = "\n".join(ladder_report.ladder_verdicts(long))
  for arm in ("jump_forecast", "jump_outer"):  # each arm's verdict line carries its own mark
    mark = cells.exercise_mark(r6["figures"][arm])
    line = next(v for v in verdicts.splitlines() if f"`{arm}`" in v)
    assert mark and f"({mark}: the comparison tested nothing" in line, line
  for arm in ("jump", "jump_forecast", "jump_outer"):
    f = tiny["rungs"]["R6"]["figures"][arm]
    assert f["exercise"]["exercised"] and "not exercised" not in ladder_report.ladder_headline_cell(
      tiny["rungs"]["R6"], f
    )


def test_a_ladder_velocity_arm_whose_runs_never_predicted_reads_not_exercised():
  """The published tiny ladder with its velocity arm's runs made to predict nothing (every step a
  backward pass, as `--config.hybrid.enable_predict=False` gives): recomputed, the arm is marked with
  its predicted steps per run in the headline cell, the rung's table and the verdict line; as published
  (about 64 of 600 steps predicted) it is not, and the arms that never predict by design are not judged."""
  (tiny,) = [json.loads(json.dumps(r)) for r in _published().values() if r["preset"] == "tiny"]
  config = record.stored_config(tiny)
  ms = {k: v["ms_per_step"] for k, v in tiny["timing"].items()}
  r6 = tiny["rungs"]["R6"]
  assert (
    r6["figures"]["hybrid"]["exercise"]["exercised"] and r6["controls"]["velocity_control"]["exercise"]["exercised"]
  )
  for arm in ("outer_momentum", "selective"):
    assert "exercise" not in r6["figures"][arm], arm
  for r in tiny["groups"][r6["group"]]["method_runs"]["hybrid"].values():
    r["backward_passes"] = r["steps"]
  tiny["rungs"] = ladder_figs.rung_figures(config, tiny["groups"], ms, tiny["steps"])
  f = tiny["rungs"]["R6"]["figures"]["hybrid"]
  assert f["exercise"] == {"predicted_steps_per_run": 0.0, "minimum": 6.0, "exercised": False}
  mark = "not exercised (0.0 predicted steps per run)"
  assert ladder_report.ladder_headline_cell(tiny["rungs"]["R6"], f).endswith(f"; {mark}")
  assert f"| hybrid, {mark} |" in ladder_report.ladder_markdown(tiny)
  verdicts = "\n".join(ladder_report.ladder_verdicts(tiny))
  assert "* `hybrid`: R6 **" in verdicts and f"({mark}: the comparison tested nothing of its predictions" in verdicts
  assert "exercise" not in tiny["rungs"]["R6"]["figures"]["outer_momentum"]


def test_a_ladder_whose_arm_no_rung_exercised_says_so_in_its_title():
  """At `quick` the ladder's only arm (jump) takes about 1 jump per run at every rung (5 attempts, the probe
  accepts one): the published tiny ladder with its jump runs made so, and its other arms left out, reads
  so in its title line; as published its title names no arm, and the long ladder's names only jump_outer
  (its R6 alone, at 1.7 jumps per run)."""
  (tiny,) = [json.loads(json.dumps(r)) for r in _published().values() if r["preset"] == "tiny"]
  title = f"# The fairness ladder: preset `tiny` (task `gpt2`, N = {tiny['steps']})"
  assert ladder_report.ladder_markdown(tiny).splitlines()[0] == title
  group = tiny["groups"][tiny["rungs"]["R6"]["group"]]
  group["methods"] = ["jump", "skip_control"]
  group["method_runs"] = {m: group["method_runs"][m] for m in group["methods"]}
  for r in group["method_runs"]["jump"].values():
    r["jumps"] = 1
  config = record.stored_config(tiny)
  ms = {k: v["ms_per_step"] for k, v in tiny["timing"].items()}
  tiny["rungs"] = ladder_figs.rung_figures(config, tiny["groups"], ms, tiny["steps"])
  assert list(tiny["rungs"]["R6"]["figures"]) == ["jump"]
  assert ladder_report.ladder_markdown(tiny).splitlines()[0] == (
    f"{title}; jump not exercised at any rung (at most 1.0 jumps per run, of 3 needed): its cells test "
    "nothing of the method"
  )
  (long,) = [r for r in _published().values() if r["preset"] == "long"]
  first = ladder_report.ladder_markdown(long).splitlines()[0]
  assert first.endswith(
    "; jump_outer not exercised at any rung (at most 1.7 jumps per run, of 3 needed): its cells "
    "test nothing of the method"
  )
