"""The benchmark protocol (`hybridjax.bench`, run by experiments/benchmark.py): its anchor runs compute
what `train()` computes, the quick preset runs the whole protocol, and every figure can be recomputed
from the raw numbers it stores. No test here asserts a speedup."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys

import chex
import jax
import ml_collections
import pytest
from conftest import ROOT, cached, load_script, micro_config

from experiments import benchmark
from experiments import gpt2_small as experiment
from experiments.configs import benchmark as benchmark_cfg
from hybridjax import codehash, registry
from hybridjax.bench import arms as arms_lib
from hybridjax.bench import figures as figures_lib
from hybridjax.bench import protocol, specs, speedrun, tasks, tuning
from hybridjax.bench.runs import keys
from hybridjax.bench.runs.anchor_run import run_anchor
from hybridjax.bench.runs.method_run import run_method
from hybridjax.bench.studies.family import figures as family_figs
from hybridjax.bench.studies.ladder import figures as ladder_figs
from hybridjax.bench.studies.ladder import rungs as ladder_rungs
from hybridjax.bench.studies.recipe import figures as recipe_figs
from hybridjax.bench.studies.recipe import run as recipe_run
from hybridjax.hybrid.phases import Branch
from hybridjax.loop import train as train_lib


def _bench_config(**benchmark_overrides):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.update(benchmark_overrides)
  return c


@pytest.mark.slow  # CI runs it (`-m ""`); kept out of the default suite's 300 s
def test_anchor_run_computes_what_train_computes(tmp_path, jax_cache):
  """The anchor runner's final raw and averaged losses are train()'s, bit for bit."""
  config = _bench_config()
  config.trainer.steps = 12  # N: a run of N steps is evaluated `eval_points` times
  spec = specs.run_spec(config, kind="anchor", seed=7, lr=0.01, steps=12, beta=0.9, betas=[0.9, 0.95])
  other = specs.run_spec(config, kind="anchor", seed=7, lr=0.01, steps=18, beta=0.9)
  assert other["config"]["trainer"]["eval_every"] == 18  # other budgets: only the final eval
  anchor = run_anchor(spec)
  c = cached(ml_collections.ConfigDict(spec["config"]), jax_cache)
  c.trainer.progress = False
  task = experiment.build_task(c)
  summary = train_lib.train(c, str(tmp_path / "run"), **task.train_kwargs())
  assert anchor["final_raw"] == summary["final_eval_loss_raw"]
  assert anchor["final_averaged"]["0.9"] == summary["final_eval_loss_averaged"]
  assert anchor["final_averaged"]["0.95"] != anchor["final_averaged"]["0.9"]  # the side average is its own
  assert [p["step"] for p in anchor["curve"]] == [6, 12]
  assert anchor["compile_s"] > 0 and anchor["train_s"] > 0 and anchor["nonfinite_skipped"] == 0


def _mlp_bench_config(task: str, steps: int = 12):
  """The quick protocol's config on an MLP task (the GPT-2 blocks dropped)."""
  c = _bench_config(task=task)
  with c.unlocked():  # the GPT-2 task's blocks, which an MLP task's config does not hold
    del c.model, c.data
  c.trainer.update(steps=steps, batch_size=16, eval_batches=4)
  return c


def test_the_mlp_task_gives_the_batches_its_config_states_or_refuses():
  from hybridjax.tasks import mlp as mlp_task

  c = _mlp_bench_config("mlp")
  task = mlp_task.build_task(c)
  assert len(task["eval_batches"]) == 4 and task["train_batch"](0)["x"].shape[0] == 16
  c.trainer.eval_batches = 33  # 33 x 16 > the 512 held-out examples: fewer would be recorded as 33
  with pytest.raises(ValueError, match=r"--config\.trainer\.eval_batches=33 batches .* need 528 held-out examples"):
    mlp_task.build_task(c)


@pytest.fixture()
def user_task(tmp_path, monkeypatch):
  """A user's task module: the built-in MLP task with an optimizer of its own (SGD with momentum,
  given as a factory learning_rate -> tx) named by `OPTIMIZER`."""
  pkg = tmp_path / "user_tasks"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "sgd_mlp.py").write_text(
    "import optax\n\nfrom hybridjax.tasks import mlp\n\nOPTIMIZER = 'sgd_nesterov'\n\n\n"
    "def build_task(config):\n"
    "  return dict(mlp.build_task(config), tx=lambda lr: optax.sgd(lr, momentum=0.9, nesterov=True))\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  yield "user_tasks.sgd_mlp"
  for name in [n for n in sys.modules if n.startswith("user_tasks")]:
    del sys.modules[name]


def test_a_task_whose_optimizer_the_schedule_would_not_drive_is_refused_before_any_run(user_task, tmp_path):
  # The anchors resolve a task's tx without train(): the benchmark checks it up front (only traced).
  specs.check_user_task(_mlp_bench_config(user_task))  # the SGD factory: driven by the schedule
  specs.check_user_task(_mlp_bench_config("mlp"))  # no optimizer of its own: nothing built
  (tmp_path / "user_tasks" / "fixed.py").write_text(
    "import optax\n\nfrom hybridjax.tasks import mlp\n\nOPTIMIZER = 'fixed_adam'\n\n\n"
    "def build_task(config):\n"
    "  return dict(mlp.build_task(config), tx=lambda learning_rate: optax.adam(1e-3))\n"
  )
  with pytest.raises(
    ValueError, match=r"task='user_tasks.fixed' gives its own optimizer \(tx\), refused: .* train\(tx="
  ):
    specs.check_user_task(_mlp_bench_config("user_tasks.fixed"))
  # Held-out batches other than the config states: the record would say 4, the eval loss average 1.
  (tmp_path / "user_tasks" / "one_eval.py").write_text(
    "from hybridjax.tasks import mlp\n\n\ndef build_task(config):\n"
    "  task = mlp.build_task(config)\n  return dict(task, eval_batches=task['eval_batches'][:1])\n"
  )
  with pytest.raises(ValueError, match=r"task='user_tasks.one_eval' \(its build_task\).*eval_batches = 1"):
    specs.check_user_task(_mlp_bench_config("user_tasks.one_eval"))


def test_a_task_that_ignores_the_seed_is_refused_before_anything_is_written(user_task, tmp_path):
  from hybridjax.bench import study

  # The MLP task with its batches drawn from seed 0 whatever config.seed says.
  (tmp_path / "user_tasks" / "one_seed.py").write_text(
    "from hybridjax.tasks import mlp\n\n\ndef build_task(config):\n"
    "  c = config.copy_and_resolve_references()\n  c.seed = 0\n  return mlp.build_task(c)\n"
  )
  c = _mlp_bench_config("user_tasks.one_seed")
  workdir = tmp_path / "bench"
  with pytest.raises(ValueError) as e:
    study.run(c, str(workdir))
  assert str(e.value) == (
    "--config.benchmark.task='user_tasks.one_seed': its first batch, train_batch(0), is the same under "
    "--config.seed=1 and 2: the task ignores config.seed, so every seed of the benchmark would train on the same "
    "data and each '± se' would measure the initialisation only. Draw the batches from config.seed in build_task; "
    "or, if the task means it, declare SEED_INDEPENDENT_DATA = True in its module (the record says so). Nothing "
    "was trained"
  )
  assert not workdir.exists()
  # A task that means it says so, and the record states it.
  with open(tmp_path / "user_tasks" / "one_seed.py", "a") as f:
    f.write("\nSEED_INDEPENDENT_DATA = True\n")
  sys.modules.pop("user_tasks.one_seed")
  specs.check_task_seeds(c)
  assert specs.task_seeds_record(c).startswith(
    "not checked: task 'user_tasks.one_seed' declares SEED_INDEPENDENT_DATA (its batches do not depend on "
  )
  # The built-in tasks draw their batches from the seed (so the benchmark does not build them twice).
  for config in (_mlp_bench_config("mlp"), _bench_config()):
    assert specs.first_batches_differ(config)
    assert specs.task_seeds_record(config) == "a built-in task: its batches are drawn from config.seed"
  specs.check_task_seeds(_mlp_bench_config(user_task))
  assert (
    specs.task_seeds_record(_mlp_bench_config(user_task)) == "checked: the task's first batch differs between two seeds"
  )


def test_an_optimizer_field_no_run_of_the_family_reads_is_refused(user_task):
  """As `train()` refuses it: with a task's own optimizer no built-in optimizer field is read (its
  weight decay would be recorded, not applied); a cosine schedule reads no `decay_fraction`; outer
  momentum's fields count only where an arm turns it on."""
  from hybridjax.bench import study

  c = _mlp_bench_config(user_task)
  c.benchmark.methods = ""
  c.optim.weight_decay = 0.05
  study.validate(c)  # from Python: the fields the command line set are not known
  with pytest.raises(ValueError, match=r"--config\.optim\.weight_decay=0\.05 \(default 0\.1\) has no effect.*no run"):
    study.validate(c, ["optim.weight_decay"])
  c = _bench_config()
  c.optim.decay_fraction = 0.5
  with pytest.raises(ValueError, match=r"--config\.optim\.decay_fraction=0\.5 \(default 0\.2\) has no effect"):
    study.validate(c, ["optim.decay_fraction"])
  c = _bench_config()
  c.optim.outer_eta = 0.5
  c.benchmark.methods = "jump,skip_control"
  with pytest.raises(ValueError, match=r"--config\.optim\.outer_eta=0\.5 \(default 0\.8\) has no effect"):
    study.validate(c, ["optim.outer_eta"])
  c.benchmark.methods = "outer_momentum"  # its arm reads it
  study.validate(c, ["optim.outer_eta"])


def test_a_tasks_own_optimizer_reaches_the_anchors_and_the_arms(user_task, tmp_path, jax_cache):
  """A task's optimizer (its `tx`, named by its `OPTIMIZER`) is in every run's config and cache key;
  the anchor and a baseline-mode arm (through `train()`) both train with it, to the same bits."""
  c = _mlp_bench_config(user_task)
  # Outer momentum's steps are the baseline loop's (it defines none of its own), here with outer_every = 0.
  c.benchmark.arms.plain = {"method": "outer_momentum", "mode": "baseline"}
  specs.validate_benchmark(c)
  assert specs.family_name(c) == f"sgd_nesterov-{c.optim.schedule}"  # the optimizer that runs, in the header
  assert specs.family_name(_mlp_bench_config("mlp")) == _mlp_bench_config("mlp").benchmark.family
  spec = specs.run_spec(c, kind="anchor", seed=7, lr=0.05, steps=12, beta=0.9)
  assert spec["config"]["optim"]["name"] == "sgd_nesterov" and spec["task"] == user_task
  arm = specs.run_spec(c, kind="method", seed=7, lr=0.05, steps=12, beta=0.9, method="plain")
  assert arm["config"]["optim"]["name"] == "sgd_nesterov"
  anchor = run_anchor(spec)
  arm["config"]["trainer"]["compile_cache_dir"] = jax_cache
  run = run_method(arm, str(tmp_path / "arm"), jax_cache)
  assert run["final_raw"] == anchor["final_raw"]
  assert run["final_averaged"] == anchor["final_averaged"]["0.9"]
  # The built-in MLP task, on the config's own optimizer (AdamW): another run, another key.
  builtin = specs.run_spec(_mlp_bench_config("mlp"), kind="anchor", seed=7, lr=0.05, steps=12, beta=0.9)
  assert builtin["config"]["optim"]["name"] == "adamw" and keys.run_key(builtin) != keys.run_key(spec)
  assert run_anchor(builtin)["final_raw"] != anchor["final_raw"]
  # A task may not take a built-in optimizer's name for its own.
  (tmp_path / "user_tasks" / "bad.py").write_text("from hybridjax.tasks.mlp import build_task\n\nOPTIMIZER = 'adamw'\n")
  with pytest.raises(ValueError, match="OPTIMIZER='adamw', a built-in optimizer's name"):
    specs.validate_benchmark(_mlp_bench_config("user_tasks.bad"))
  with pytest.raises(ValueError, match="benchmark.task='user_tasks.nothing' names no task"):
    specs.validate_benchmark(_mlp_bench_config("user_tasks.nothing"))


def test_the_cache_key_follows_the_code_a_run_imports(user_task, tmp_path):
  """An anchor's key covers the baseline loop and its task, never the hybrid algorithm, a method,
  the tuning, the figures, the report or the plots; a method arm's adds the loop and its method.
  Editing the task's code changes the key; a comment does not."""

  def files(*modules):
    return {os.path.relpath(p, ROOT) for m in modules for p in codehash.source_closure(m)}

  results_side = (
    "hybridjax/bench/study",
    "hybridjax/bench/studies/",
    "hybridjax/bench/cells",
    "hybridjax/bench/figures",
    "hybridjax/bench/tuning",
    "hybridjax/plotting",
  )
  for task in ("gpt2", "mlp"):
    anchor = files(keys.RUNNER_MODULES["anchor"], tasks.task_path(task))
    assert {"hybridjax/loop/baseline.py", "hybridjax/optim.py", f"hybridjax/tasks/{task}.py"} <= anchor
    assert not any(f.startswith(("hybridjax/hybrid/", "hybridjax/methods/", "experiments/")) for f in anchor), anchor
    assert not any(f.startswith(results_side) for f in anchor) and "hybridjax/loop/train.py" not in anchor
  jump = files(keys.RUNNER_MODULES["method"], tasks.task_path("mlp"), registry.method_path("jump"))
  assert {"hybridjax/loop/train.py", "hybridjax/methods/jump/__init__.py", "hybridjax/methods/jump/forecast.py"} <= jump
  assert not any(f.startswith(results_side + ("experiments/",)) for f in jump), jump
  assert "hybridjax/methods/velocity/__init__.py" not in jump  # another method's edit keeps the jump's runs
  # A user's task: its own file is hashed, the distributions it imports are versioned.
  spec = specs.run_spec(_mlp_bench_config(user_task), kind="anchor", seed=7, lr=0.05, steps=12, beta=0.9)
  assert "optax" in codehash._distributions([user_task])
  key = keys.run_key(spec)
  with open(tmp_path / "user_tasks" / "sgd_mlp.py", "a") as f:
    f.write("# a comment\n")
  assert keys.run_key(spec) == key
  with open(tmp_path / "user_tasks" / "sgd_mlp.py", "a") as f:
    f.write("MOMENTUM = 0.9\n")
  assert keys.run_key(spec) != key


def test_bad_benchmark_settings_name_the_field():
  with pytest.raises(ValueError, match="benchmark.methods"):
    specs.validate_benchmark(_bench_config(methods="hybrid,magic"))
  with pytest.raises(ValueError, match="must not share a seed"):
    specs.validate_benchmark(_bench_config(seeds=(1001, 5)))
  with pytest.raises(ValueError, match="benchmark.budgets"):
    specs.validate_benchmark(_bench_config(budgets=(0.5, 2.0)))
  # A repeated seed is one run counted twice: its spread would shrink with no new measurement.
  with pytest.raises(ValueError, match=r"--config.benchmark.seeds=\(1, 1\) repeats seed\(s\) \[1\].*seeds=\(1, 2\)\)"):
    specs.validate_benchmark(_bench_config(seeds=(1, 1)))
  with pytest.raises(ValueError, match=r"--config.benchmark.tuning_seeds=\(1001, 1001\) repeats"):
    specs.validate_benchmark(_bench_config(tuning_seeds=(1001, 1001)))
  c = _bench_config()
  c.trainer.averaging = "none"
  with pytest.raises(ValueError, match="trainer.averaging=ema"):
    specs.validate_benchmark(c)
  with pytest.raises(ValueError, match="unknown benchmark config"):
    benchmark_cfg.get_config("long,adagrad")


def test_lr_grid_is_a_sqrt2_grid_around_the_centre():
  grid = tuning.lr_grid(6e-3, 5)
  assert grid[2] == 6e-3 and len(grid) == 5
  for a, b in zip(grid, grid[1:]):
    assert b / a == pytest.approx(math.sqrt(2), rel=1e-3)


def test_step_kinds_come_from_the_arms_method():
  velocity = arms_lib.Arm(name="hybrid", method="velocity")
  assert arms_lib.step_kind(velocity, {"branch": Branch.FULL_STEP, "measured": True}) == "full_step"
  assert arms_lib.step_kind(velocity, {"branch": Branch.PREDICT_STEP, "measured": False}) == "predict_step"
  assert arms_lib.step_kind(velocity, {"branch": Branch.PREDICT_STEP, "measured": True}) == "predict_step+validation"
  assert arms_lib.step_kind(velocity, {"branch": Branch.CORRECT_STEP, "measured": True}) == "correct_step"
  jump = arms_lib.Arm(name="jump", method="jump")
  assert arms_lib.step_kind(jump, {"branch": Branch.PREDICT_STEP, "measured": True}) == "jump_step"
  assert (
    arms_lib.step_kind(jump, {"branch": Branch.FULL_STEP, "measured": True, "snapshot": True}) == "full_step+snapshot"
  )
  outer = arms_lib.Arm(name="outer_momentum", method="outer_momentum", mode="baseline")
  assert arms_lib.step_kind(outer, {"branch": Branch.PREDICT_STEP, "measured": True}) == arms_lib.REAL_STEP


def test_method_figures_ratio_is_above_one_only_below_the_curve():
  budgets = [50, 100, 200]
  curves = {a: {"1": [2.0, 1.8, 1.6], "2": [2.1, 1.85, 1.62]} for a in figures_lib.ANCHORS}
  kinds = {"full_step": 80, "predict_step": 20}
  runs = {
    "1": {"final_loss": 1.7, "final_raw": 1.75, "backward_passes": 80, "validation_forwards": 6, "steps": 100},
    "2": {"final_loss": 1.95, "final_raw": 1.97, "backward_passes": 80, "validation_forwards": 6, "steps": 100},
  }
  for r in runs.values():
    r["step_kinds"] = kinds
  timing = {"baseline": {"baseline": 10.0}, "method": {"full_step": 10.0, "predict_step": 2.0}}
  f = figures_lib.method_figures(curves, runs, timing, budgets)["baseline"]
  one, two = f["per_seed"]["backward_ratio"]
  assert one["value"] == pytest.approx(100 * 2**0.5 / 80)  # 1.7 is halfway (in log budget) from 100 to 200
  assert two["value"] < 1  # 1.95 is above the curve at 80 backward passes (1.93)
  passes = f["per_seed"]["pass_ratio"][0]
  assert passes["value"] == pytest.approx(one["baseline_steps"] / (80 + 6 / 3))
  wall = f["per_seed"]["wallclock_ratio"][0]
  assert wall["value"] == pytest.approx(one["baseline_steps"] * 10.0 / (80 * 10.0 + 20 * 2.0))
  assert f["final_loss_gap"]["anchor_final_loss"] == [1.8, 1.85]
  # A step kind without a timing gives no wall-clock ratio, never a made-up one.
  runs["1"]["step_kinds"] = {"full_step": 80, "correct_step": 20}
  g = figures_lib.method_figures(curves, runs, timing, budgets)["baseline"]
  assert g["per_seed"]["wallclock_ratio"][0]["value"] is None


@pytest.fixture(scope="module")
def quick(tmp_path_factory, jax_cache):
  workdir = str(tmp_path_factory.mktemp("bench") / "quick")
  # In this process: its runs compile once here rather than once in each of two fresh worker
  # processes (the same programs and flags, so the same bits: test_cluster.py compares executors).
  config = _bench_config(workers=1)
  config.trainer.compile_cache_dir = jax_cache  # the test run's shared cache; a real benchmark starts cold
  return workdir, config, benchmark.run_benchmark(config, workdir)


@pytest.mark.cross_program
@pytest.mark.slow  # the whole GPT-2 protocol (~70 s); the default suite runs it on the MLP (below)
def test_quick_protocol_computes_what_it_did_when_recorded(quick):
  """The quick protocol's losses and step counts, kept as recorded (scripts/method_numerics.py), one
  record per machine kind (XLA:CPU compiles for the host's instruction set): on a recorded machine
  kind bit for bit; elsewhere, where rounding may flip a method's phase decision, the anchors' budget
  curves (real steps only) to 1% of the first record's."""
  workdir, _, _ = quick
  numerics = load_script("method_numerics")
  with open(os.path.join(workdir, "benchmark.json")) as f:
    got = numerics.quick_numerics(json.load(f))
  with open(numerics.QUICK_RECORD) as f:
    records = json.load(f)["records"]
  if os.environ.get("HYBRIDJAX_WRITE_NUMERICS"):  # this machine kind's record, added or replaced
    records = [r for r in records if r["machine"] != numerics.machine()] + [
      {"machine": numerics.machine(), "numerics": got}
    ]
    with open(numerics.QUICK_RECORD, "w") as f:
      json.dump({"records": records}, f, indent=1)
  here = [r["numerics"] for r in records if r["machine"] == numerics.machine()]
  if here:
    assert got == here[0]
  else:
    assert jax.tree.structure(got["curves"]) == jax.tree.structure(records[0]["numerics"]["curves"])
    chex.assert_trees_all_close(got["curves"], records[0]["numerics"]["curves"], rtol=1e-2)


@pytest.mark.slow  # the whole GPT-2 protocol (~70 s); the default suite runs it on the MLP (below)
def test_quick_protocol_runs_whole_and_its_figures_recompute(quick):
  workdir, config, result = quick
  n = config.trainer.steps
  with open(os.path.join(workdir, "benchmark.json")) as f:
    stored = json.load(f)
  with open(os.path.join(workdir, "headline.json")) as f:
    head = json.load(f)
  # The headline's fields, each from the stored raw numbers.
  for key in ("preset", "family", "tuning_seeds", "seeds", "lr_sweep", "best_lr", "averaging_beta", "budgets"):
    assert key in head, key
  for key in ("backward_ratio", "pass_ratio", "wallclock_ratio", "final_loss_gap"):
    assert set(head[key]) == {"vs_baseline", "vs_averaged_baseline"}, key
  assert set(head["final_loss"]) == {"baseline", "averaged_baseline", "method"}
  assert head["budgets"] == [round(f * n) for f in sorted(config.benchmark.budgets)]
  # Tuning: every sweep run is recorded; the best LR is the better two-seed mean of the best two.
  t = stored["tuning"]
  swept = {r["lr"] for r in t["rows"] if r["budget"] == n and r["seed"] == config.benchmark.tuning_seeds[0]}
  assert set(t["grid"]) == swept and len(swept) >= config.benchmark.lr_points
  assert min(t["best_two_means"].values()) == t["best_two_means"][str(t["best_lr"])]
  assert t["averaging_beta"] in config.benchmark.betas
  # The anchors: every headline seed at every budget, run at its budget's LR.
  for anchor in figures_lib.ANCHORS:
    assert sorted(stored["curves"][anchor]) == sorted(str(s) for s in config.benchmark.seeds)
    assert all(len(v) == len(head["budgets"]) and None not in v for v in stored["curves"][anchor].values())
  for key, run in stored["budget_runs"].items():
    factor = run["steps"] / n
    assert run["lr"] == t["per_budget_lr"][str(factor)], key
    assert stored["curves"]["baseline"][str(run["seed"])][head["budgets"].index(run["steps"])] == run["final_raw"]
  # Method runs: every step is counted once by kind; real steps are the backward passes; a jump of k
  # schedule steps is one step, and the run ends when its schedule does.
  horizons = len(config.hybrid.jump.horizons)
  defined = arms_lib.arms(config)
  for method, runs in stored["method_runs"].items():
    for run in runs.values():
      kinds = run["step_kinds"]
      real = kinds.get("full_step", 0) + kinds.get("correct_step", 0) + kinds.get(arms_lib.REAL_STEP, 0)
      assert real == run["backward_passes"]
      if defined[method].method == "jump":
        assert run["jumps"] > 0 and "jumps" in run["method_stats"], method
        assert sum(kinds.values()) == real + kinds["jump_step"]
        assert real + run["jump_steps"] == n
        assert run["validation_forwards"] == kinds["jump_step"] * (1 + horizons)
      else:
        assert sum(kinds.values()) == n
        assert kinds.get("predict_step+validation", 0) == run["validation_forwards"]
      assert run["memory_growth_bytes"] == 0
      assert run["final_loss"] == run["final_averaged"]  # its model is the averaged params
  # Every figure recomputes from the stored raw numbers.
  for method, figures in stored["figures"].items():
    rounds = stored["timing"]["rounds_ms"]
    timing = {
      "baseline": stored["timing"]["ms_per_step"]["baseline"],
      "method": stored["timing"]["ms_per_step"][method],
      "rounds": {"baseline": rounds["baseline"], "method": rounds[method]},
    }
    again = figures_lib.method_figures(
      stored["curves"],
      stored["method_runs"][method],
      timing,
      stored["budgets"],
      stored["eval"]["paired_se"],
      eval_windows=stored["eval"]["batches"],
    )
    assert json.loads(json.dumps({k: v for k, v in figures.items() if k != "vs_skip_control"})) == json.loads(
      json.dumps(again)
    )
    for anchor in figures_lib.ANCHORS:
      for ratio in figures[anchor]["per_seed"]["backward_ratio"]:
        assert ratio["value"] is None or ratio["value"] > 0
  # The jump is credited only against the skip control: their paired difference, recomputed.
  runs = stored["method_runs"]
  seeds = sorted(runs["jump"], key=int)
  assert stored["figures"]["jump"]["vs_skip_control"] == json.loads(
    json.dumps(
      protocol.paired_difference(
        [runs["jump"][s]["final_loss"] for s in seeds],
        [runs["skip_control"][s]["final_loss"] for s in seeds],
        stored["eval"]["paired_se"],
        eval_windows=stored["eval"]["batches"],
      )
      | {"control": "skip_control"}
    )
  )
  refigured = json.loads(json.dumps(family_figs.family_figures(stored)))
  assert {k: stored[k] for k in refigured} == refigured
  assert head["method"] == "jump" and head["vs_skip_control"] == stored["figures"]["jump"]["vs_skip_control"]
  assert (
    head["backward_ratio"]["vs_averaged_baseline"]
    == stored["figures"]["jump"]["averaged_baseline"]["backward_ratio"]["mean"]
  )
  reach = protocol.steps_to_reach_at_n(  # read as the anchor reads itself at N (`figures.method_figures`)
    stored["budgets"],
    stored["curves"]["averaged_baseline"]["1"],
    runs["jump"]["1"]["final_loss"],
    runs["jump"]["1"]["steps"],
  )
  assert stored["figures"]["jump"]["averaged_baseline"]["per_seed"]["backward_ratio"][0]["baseline_steps"] == (
    reach.steps
  )
  # The report and the plots.
  with open(os.path.join(workdir, "results.md")) as f:
    md = f.read()
  assert f"Best LR {t['best_lr']:.3g}" in md and "backward_ratio vs averaged_baseline" in md
  for name in ("budget_curve.png", "lr_sweep.png", "eval_curves.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 1000, name


def test_the_protocol_runs_whole_on_the_mlp_task_and_a_rerun_trains_nothing(tmp_path, jax_cache, capsys):
  """The whole protocol at its smallest (the MLP task, one arm, in this process): the tuning, both
  anchors' budget curves, the arm, the timing, every figure recomputed from the stored numbers, the
  progress lines; run again, every run comes from the cache and every figure is the same."""
  c = _mlp_bench_config("mlp", steps=24)
  c.trainer.compile_cache_dir = jax_cache
  c.benchmark.update(methods="outer_momentum", workers=1, timing_rounds=2, timing_steps=5)
  workdir = str(tmp_path / "bench")
  result = benchmark.run_benchmark(c, workdir)
  assert re.search(r"done anchor seed 1001 lr \S+ steps 24 \(\d+ s\) \[1/\d+, ETA", capsys.readouterr().out)
  with open(os.path.join(workdir, "benchmark.json")) as f:
    stored = json.load(f)
  n_runs = len(stored["tuning"]["rows"]) + len(stored["budget_runs"]) + len(stored["method_runs"]["outer_momentum"])
  assert result["runs_trained"] >= n_runs - len(stored["tuning"]["rows"]) > 0
  timing = {"baseline": stored["timing"]["ms_per_step"]["baseline"]}
  timing["method"] = stored["timing"]["ms_per_step"]["outer_momentum"]
  rounds = stored["timing"]["rounds_ms"]  # each timing round's medians: the wall-clock ratio's spread
  timing["rounds"] = {"baseline": rounds["baseline"], "method": rounds["outer_momentum"]}
  runs = stored["method_runs"]["outer_momentum"]
  eval_se = stored["eval"]["paired_se"]  # every difference is judged with it besides the seeds'
  again = figures_lib.method_figures(
    stored["curves"], runs, timing, stored["budgets"], eval_se, eval_windows=stored["eval"]["batches"]
  )
  assert json.loads(json.dumps(again)) == json.loads(json.dumps(stored["figures"]["outer_momentum"]))
  wall = stored["figures"]["outer_momentum"]["averaged_baseline"]["wallclock_ratio"]
  assert wall["mean"] is None or wall["spread"]["rounds"] == len(rounds["baseline"]["baseline"]) == 2
  refigured = json.loads(json.dumps(family_figs.family_figures(stored)))
  assert {k: stored[k] for k in refigured} == refigured
  rerun = benchmark.run_benchmark(c, workdir)
  assert rerun["runs_trained"] == 0 and rerun["runs_cached"] == result["runs_trained"]
  assert rerun["curves"] == result["curves"] and rerun["method_runs"] == result["method_runs"]


@pytest.mark.slow  # the whole GPT-2 protocol (~70 s); the default suite runs it on the MLP (above)
def test_rerun_with_other_methods_reuses_the_cached_runs(quick):
  workdir, config, first = quick
  again = ml_collections.ConfigDict(config.to_dict())
  again.benchmark.methods = "jump"
  result = benchmark.run_benchmark(again, workdir)
  assert result["runs_trained"] == 0 and result["runs_cached"] > 0
  assert result["curves"] == first["curves"] and result["tuning"]["best_lr"] == first["tuning"]["best_lr"]
  assert list(result["figures"]) == ["jump"] and "vs_skip_control" not in result["figures"]["jump"]


def test_corpus_epochs_warn_past_four():
  c = micro_config(steps=100)
  assert experiment.corpus_epochs(c, 100 * 4 * 32 * 2) == pytest.approx(0.5)
  assert experiment.epochs_warning(c, 100 * 4 * 32) is None  # exactly one epoch
  warning = experiment.epochs_warning(c, 100)
  assert warning and "--config.data.path" in warning


@pytest.mark.slow
def test_the_ladder_on_the_quick_runs_shares_them_and_its_figures_recompute(quick):
  """Two rungs on the micro model: R1 (the untuned constant LR's 2N curve and its arms) trains; R3
  reads the protocol's cosine runs from the cache. Every ladder figure recomputes from ladder.json."""
  workdir, config, first = quick
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.study = "ladder"
  c.benchmark.update(timing_rounds=2, timing_steps=5)  # the timing's code path; its figures are not read here
  c.benchmark.ladder.rungs = "R1,R3"  # R6 (a whole family on Muon) is its own test below
  n = int(c.trainer.steps)
  result = benchmark.run_benchmark(c, workdir)
  assert result["rung_names"] == ["R1", "R3"] and result["verdict_rungs"] == []
  untuned, cosine = result["groups"]["untuned"], result["groups"]["cosine"]
  # R3/R4's runs are the protocol's own: the same curves, all from the cache; only R1's group trained.
  for s, base in cosine["baseline"].items():
    assert base["raw"] == first["curves"]["baseline"][s] and base["averaged"] == first["curves"]["averaged_baseline"][s]
  arms = ladder_rungs.names(c.benchmark.ladder.methods)
  seeds = [int(s) for s in c.benchmark.seeds]
  assert result["runs_trained"] == len(seeds) * (1 + len(arms))
  # R1's baseline: one 2N run per seed at the untuned LR held constant, evaluated along the way.
  every = 2 * n // int(c.benchmark.ladder.constant_eval_points)
  for base in untuned["baseline"].values():
    assert base["steps"] == list(range(every, 2 * n + 1, every))
  for runs in untuned["method_runs"].values():
    assert all(r["lr"] == c.benchmark.ladder.untuned_lr and r["steps"] == n for r in runs.values())
  # Every figure recomputes from the stored file.
  with open(os.path.join(workdir, "ladder-quick.json")) as f:
    stored = json.load(f)
  ms = {k: v["ms_per_step"] for k, v in stored["timing"].items()}
  rounds = {k: v["rounds_ms"] for k, v in stored["timing"].items()}
  again = ladder_figs.rung_figures(c, stored["groups"], ms, n, rounds)
  assert json.loads(json.dumps(again)) == stored["rungs"]
  # One figure by hand: R1's pass ratio of the jump on the first seed.
  run, base = untuned["method_runs"]["jump"]["1"], untuned["baseline"]["1"]
  reach = protocol.steps_to_reach(base["steps"], base["raw"], run["final_raw"])
  passes = run["backward_passes"] + figures_lib.FORWARD_COST * run["validation_forwards"]
  got = stored["rungs"]["R1"]["figures"]["jump"]["per_seed"]["pass_ratio"][0]["value"]
  assert (got is None and reach.steps is None) or got == pytest.approx(reach.steps / passes)
  assert stored["rungs"]["R1"]["figures"]["jump"]["control"] == "skip_control"
  # The outputs: the table names every arm at every rung, the figure is drawn, the cosine family's
  # protocol results are re-written from the same runs.
  with open(os.path.join(workdir, "ladder-quick.md")) as f:
    md = f.read()
  assert "| jump |" in md and "## R1: untuned LR held constant" in md
  assert os.path.getsize(os.path.join(workdir, "ladder-quick.png")) > 1000
  with open(os.path.join(workdir, first["family"], "benchmark.json")) as f:
    assert json.load(f)["curves"] == first["curves"]


@pytest.mark.slow
def test_the_quick_recipe_reads_each_step_on_the_anchors_curve_and_recomputes(quick):
  """The recipe's code path on the micro model: two tricks against the protocol's cosine anchor (its
  runs from the cache, its curve extended), every figure recomputed from recipe.json; the last step
  is the whole quick recipe, R6's family, so its tuning runs are the ladder's."""
  workdir, config, first = quick
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.study = "recipe"
  c.benchmark.update(timing_rounds=2, timing_steps=5)
  n = int(c.trainer.steps)
  result = benchmark.run_benchmark(c, workdir)
  assert result["tricks"] == ["schedule", "muon"]
  anchor = result["anchor"]
  assert anchor["lr"] == first["tuning"]["best_lr"]
  assert anchor["budgets"][-1] >= 3 * n  # the curve extended past the protocol's 2N
  for s, curve in anchor["curves"].items():  # the protocol's own averaged anchor, where both have a budget
    for b, loss in zip(first["budgets"], first["curves"]["averaged_baseline"][s]):
      assert curve["loss"][curve["steps"].index(b)] == loss
  with open(os.path.join(workdir, "recipe-quick.json")) as f:
    stored = json.load(f)
  again = json.loads(json.dumps(recipe_figs.recipe_figures(stored)))
  assert again == {k: stored[k] for k in ("figures", "total_speedup")}
  # Measured with today's trick list, which it names; nothing kept from a command line here.
  assert stored["trick_list"] == speedrun.TRICK_LIST_VERSION and speedrun.trick_list(stored) is speedrun.TRICKS
  assert stored["kept"] == {} and set(stored["adapted"]) == {"muon"}
  # One speed-up by hand: the last step on the first seed, read on that seed's anchor curve.
  muon = stored["step_runs"]["muon"]
  assert muon["iterate"] in ("raw", "averaged") and muon["lr"] in muon["grid"]
  s = sorted(muon["runs"], key=int)[0]
  curve = anchor["curves"][s]
  reach = protocol.steps_to_reach_at_n(curve["steps"], curve["loss"], muon["runs"][s]["loss"], n)
  got = stored["figures"][-1]["speedup"]["per_seed"][0]
  assert (got is None and reach.steps is None) or got == pytest.approx(reach.steps / n)
  assert stored["total_speedup"]["name"] == "muon"
  # Two headline seeds are too few to judge a plateau (three at least): none flagged, none added.
  assert stored["plateaus"] == {"runs": [], "seeds_added": []}
  assert all(step["plateaus"] == [] for step in stored["step_runs"].values())
  # Each step is paired with the one before it; the anchor with nothing.
  assert stored["figures"][0]["vs_previous"] is None and stored["figures"][2]["vs_previous"]["n"] == len(
    c.benchmark.seeds
  )
  with open(os.path.join(workdir, "recipe-quick.md")) as f:
    assert "| schedule |" in f.read()
  assert os.path.getsize(os.path.join(workdir, "recipe-quick.png")) > 1000


@pytest.mark.slow
def test_the_quick_knobs_study_tunes_both_sides_alike_from_the_quick_recipe(quick):
  """The knobs study's code path on the micro model: the anchor and the recipe's Muon row, each
  searching two knobs of two values (`benchmark.knobs.set='quick'`) from the quick recipe's record,
  each side the same tuning runs, every figure recomputed from its record."""
  from hybridjax.bench.studies.knobs import report as knobs_report
  from hybridjax.bench.studies.knobs import run as knobs_run

  workdir, config, _ = quick
  c = ml_collections.ConfigDict(config.to_dict())
  if not os.path.exists(os.path.join(workdir, "recipe-quick.json")):  # its LRs come from the recipe's record
    c.benchmark.update(study="recipe", timing_rounds=2, timing_steps=5)
    benchmark.run_benchmark(c, workdir)
  c.benchmark.study = "knobs"
  c.benchmark.knobs.update(sides="anchor,muon", lrs_from=os.path.join(workdir, "recipe-quick.json"))
  assert c.benchmark.knobs.set == "quick"
  result = benchmark.run_benchmark(c, workdir)
  sides = result["sides"]
  assert {s["tuning_runs"] for s in sides.values()} == {2 * (1 + 4 + 2)}  # as is, 4 settings, 2 new LRs
  assert [sw["knob"] for sw in sides["muon"]["sweeps"]] == ["muon_momentum", "groups_lr_scale"]
  for s in sides.values():
    again = knobs_run.side_figures(
      s["runs"]["published"], s["runs"]["tuned"], knobs_run.read_of(s["published_settings"], s["tuned_read"])
    )
    assert again["difference"] == s["difference"]
  with open(os.path.join(workdir, "recipe-quick.json")) as f:
    recipe = json.load(f)
  reading = knobs_run.anchor_reading(recipe, sides, result["seeds"], int(c.trainer.steps))
  assert reading == {k: result[k] for k in ("on_r4_curve", "anchor_reproduced")}
  # The anchor as published is the recipe's anchor run again: the same loss at N, bit for bit.
  assert all(result["anchor_reproduced"].values())
  with open(os.path.join(workdir, "knobs-quick.md")) as f:
    assert f.read() == knobs_report.markdown(result) + "\n"


@pytest.mark.slow
def test_a_plateau_adds_the_plateau_seeds_to_every_recipe_step_and_the_anchor(quick, tmp_path, monkeypatch):
  """The recipe's plateau extension on the quick runs (a copy of their cache): an anchor run flagged
  as a plateau adds `benchmark.plateau_seeds` to the anchor's curve and every step, each step stays
  paired seed by seed with the one before it, and every figure recomputes from recipe.json."""
  workdir, config, _ = quick
  shutil.copytree(os.path.join(workdir, "cache"), tmp_path / "cache")
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.study = "recipe"
  c.benchmark.update(timing_rounds=2, timing_steps=5, plateau_seeds=(3,))
  flag = {"run": "anchor", "seed": "2", "at_step": 4, "loss": 9.0, "median_over_seeds": 3.0}
  seen = []

  def flagged_once(curves, n, margin):  # the first reading flags a run; the reading after the extension none
    seen.append(sorted({key.split("/")[0] for key in curves["runs"]}))
    return [flag] if len(seen) == 1 else []

  monkeypatch.setattr(recipe_run, "anchor_plateaus", flagged_once)
  result = benchmark.run_benchmark(c, str(tmp_path))
  assert seen == [["1", "2"], ["1", "2", "3"]]
  assert result["plateaus"] == {"runs": [flag], "seeds_added": [3], "anchor_after": []}
  assert sorted(result["anchor"]["at_n"]) == sorted(result["anchor"]["curves"]) == ["1", "2", "3"]
  for row in result["figures"]:
    assert row["seeds"] == [1, 2, 3], row["name"]
  assert result["figures"][-1]["vs_previous"]["n"] == 3
  with open(tmp_path / "recipe-quick.json") as f:
    stored = json.load(f)
  again = json.loads(json.dumps(recipe_figs.recipe_figures(stored)))
  assert again == {k: stored[k] for k in ("figures", "total_speedup")}


@pytest.mark.slow
def test_the_quick_optimizers_study_reads_both_sides_on_their_own_curves(quick):
  """The optimizers study's code path on the micro model: the quick recipe's AdamW row (`schedule`) and
  Muon row at the recipe record's settings, each on its own budget curve with its per-budget re-checks,
  both readings of the factor and the cell's verdict recomputed from its record."""
  from hybridjax.bench import factor
  from hybridjax.bench.studies.optimizers import run as optimizers_run

  workdir, config, _ = quick
  c = ml_collections.ConfigDict(config.to_dict())
  if not os.path.exists(os.path.join(workdir, "recipe-quick.json")):  # its rows' settings come from it
    c.benchmark.update(study="recipe", timing_rounds=2, timing_steps=5)
    benchmark.run_benchmark(c, workdir)
  c.benchmark.study = "optimizers"
  c.benchmark.optimizers.update(lrs_from=os.path.join(workdir, "recipe-quick.json"), draws=200)
  result = benchmark.run_benchmark(c, workdir)
  with open(os.path.join(workdir, "recipe-quick.json")) as f:
    recipe = json.load(f)
  n = int(c.trainer.steps)
  for side, row in (("adamw", "schedule"), ("muon", "muon")):
    rec = result["sides"][side]
    assert rec["settings"]["row"] == row and rec["settings"]["lr"] == recipe["step_runs"][row]["lr"]
    assert {f"{s}/{round(f * n)}" for s in result["seeds"] for f in rec["budgets"]} == set(rec["runs"])
  assert sorted(result["sides"]["adamw"]["rechecks"]) == [str(f) for f in result["sides"]["adamw"]["budgets"] if f != 1]
  assert result["seeds"][:2] == [21, 22] and result["tuning_seeds"] == [1001, 1002, 1003]
  for reading in ("a", "b"):
    r = result["factor"][reading]
    assert r["ci95"][0] <= r["mean"] <= r["ci95"][1] or r["bound"] is not None
  assert result["verdict"] == factor.verdict_against_one(result["factor"]["a"])["verdict"]
  with open(os.path.join(workdir, "optimizers-as_published-quick.json")) as f:
    stored = json.load(f)
  assert json.loads(json.dumps(optimizers_run.cell_figures(stored))) == {
    k: stored[k] for k in ("factor", "verdict", "factor_raw", "interpolated", "verdict_against_one")
  }
  with open(os.path.join(workdir, "optimizers-as_published-quick.md")) as f:
    assert f.read() == optimizers_run.markdown(stored) + "\n"


@pytest.mark.slow
def test_r6_on_the_quick_preset_is_the_whole_recipe_with_one_arm(quick):
  """R6 as the quick preset runs it: the whole quick recipe (the schedule and Muon with its groups),
  tuned like a family, read at the iterate its tuning seeds chose, its one arm against its control;
  every figure recomputes from ladder.json."""
  workdir, config, _ = quick
  c = ml_collections.ConfigDict(config.to_dict())
  c.benchmark.study = "ladder"
  c.benchmark.update(timing_rounds=2, timing_steps=5)
  c.benchmark.ladder.rungs = "R6"
  result = benchmark.run_benchmark(c, workdir)
  speedrun = result["groups"]["speedrun"]
  r6 = result["rungs"]["R6"]
  assert result["verdict_rungs"] == ["R6"] and speedrun["family"] == "speedrun-muon_groups-wsd"
  assert r6["iterate"] == speedrun["tuning"]["iterate"] in ("raw", "averaged")
  assert set(r6["figures"]) == {"jump"} and r6["figures"]["jump"]["control"] == "skip_control"
  with open(os.path.join(workdir, "ladder-quick.json")) as f:
    stored = json.load(f)
  ms = {k: v["ms_per_step"] for k, v in stored["timing"].items()}
  rounds = {k: v["rounds_ms"] for k, v in stored["timing"].items()}
  again = ladder_figs.rung_figures(c, stored["groups"], ms, int(c.trainer.steps), rounds)
  assert json.loads(json.dumps(again)) == stored["rungs"]


def test_the_jump_schedule_scales_with_the_runs_length():
  """long's jump schedule (chosen at N = 3000) as it is; tiny's (N = 600) and deep's (N = 1500) in
  proportion, so that their jump arms attempt about as many jumps per run as long's; quick keeps its own."""
  expected = {
    "long": ((50, 100, 200), 100, 50),
    "tiny": ((10, 20, 40), 20, 10),
    "deep": ((25, 50, 100), 50, 25),
    "124m": ((83, 167, 333), 167, 83),
    "quick": ((2, 4, 8), 6, 50),
  }
  for preset, (horizons, every, forecast_every) in expected.items():
    for arg in (preset, f"{preset},muon"):
      c = benchmark_cfg.get_config(arg)
      j = c.hybrid.jump
      assert (tuple(j.horizons), j.every, j.forecaster.every) == (horizons, every, forecast_every), arg
      # Every jump arm's run spec trains with it (no arm overrides the schedule).
      lr, beta = 1e-3, float(c.benchmark.betas[0])
      for spec in tuning.method_specs(c, ["jump", "skip_control", "jump_forecast"], lr, beta)[
        :: len(c.benchmark.seeds)
      ]:
        sj = spec["config"]["hybrid"]["jump"]
        assert (tuple(sj["horizons"]), sj["every"], sj["forecaster"]["every"]) == (horizons, every, forecast_every)
  # Horizons stay distinct where rounding would merge them.
  c = benchmark_cfg.get_config("tiny")
  c.trainer.steps = 10
  benchmark_cfg.scale_jump_schedule(c)
  assert tuple(c.hybrid.jump.horizons) == (1, 2, 3) and c.hybrid.jump.every == 1 and c.hybrid.jump.forecaster.every == 1
