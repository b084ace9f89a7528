"""The knobs study through the skeleton with a stub runner (nothing trains): the same tuning budget
per side, the coordinate search keeping what lowers the loss, and its figures from its record."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math

import pytest
from conftest import SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import comparison, speedrun, study
from hybridjax.bench.studies.knobs import curves, report, run
from hybridjax.bench.studies.knobs.sets import SIDES


def _config(tmp_path):
  c = benchmark_cfg.get_config("quick")
  c.model.n_layer = 2
  c.trainer.steps = 300  # a warm-up knob's values are fractions of it: distinct values (nothing trains)
  c.benchmark.study = "knobs"
  c.benchmark.knobs.set = "full"  # the published search (the quick preset's own is 'quick')
  curves = {str(s): {"steps": [150, 300, 600], "loss": [3.2, 3.0, 2.8]} for s in c.benchmark.seeds}
  at_n = {str(s): 3.0 for s in c.benchmark.seeds}  # no stub run gives it: none reproduced
  anchor = {"lr": 0.004, "beta": 0.99, "curves": curves, "at_n": at_n}
  recipe = {"trick_list": 2, "tricks": list(speedrun.TRICKS), "anchor": anchor, "step_runs": {}}
  for k, name in enumerate(speedrun.TRICKS):
    recipe["step_runs"][name] = {"lr": 0.01 * (k + 1), "beta": 0.99, "iterate": "averaged"}
  path = tmp_path / "recipe-quick.json"
  path.write_text(json.dumps(recipe))
  c.benchmark.knobs.lrs_from = str(path)
  return c


def _stub_result(spec):
  """Lowest with b2 0.99 under AdamW and Muon's momentum 0.9, and at each side's published LR."""
  c = spec["config"]
  noise = int(hashlib.md5(json.dumps(spec, sort_keys=True).encode()).hexdigest(), 16) % 1000 * 1e-5
  loss = 3.0 + 0.01 * c["seed"] + noise + 0.1 * math.log(c["optim"]["learning_rate"] / 0.004) ** 2
  loss -= 0.05 * (c["optim"]["name"] == "adamw" and c["optim"]["b2"] == 0.99)
  loss -= 0.05 * (c["optim"]["muon_momentum"] == 0.9)
  return {
    "seed": c["seed"],
    "final_raw": loss,
    "final_averaged": {str(b): loss - 0.01 for b in spec["betas"]},
    "final_averaged_per_batch": [loss - 0.01 + 0.001 * j for j in range(3)],
  }


@pytest.mark.slow  # the whole search through the skeleton, 100 stub runs of configs (7 s); the slow quick run trains it
def test_each_side_spends_the_same_runs_and_keeps_what_lowers_the_loss(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  result = study.run(_config(tmp_path), str(tmp_path / "work"))
  sides = result["sides"]
  assert {s["tuning_runs"] for s in sides.values()} == {2 * (1 + 14 + 2)}  # as is, 14 settings, 2 new LRs
  assert all(sum(len(set(k.values_at(300))) for k in SIDES[s]) == 14 for s in SIDES)
  anchor, muon = sides["anchor"], sides["muon"]
  assert anchor["tuned_fields"].get("optim.b2") == 0.99 and "optim.b2" not in muon["tuned_fields"]
  assert muon["tuned_fields"].get("optim.muon_momentum") == 0.9
  assert [sw["knob"] for sw in anchor["sweeps"]] == [k.name for k in SIDES["anchor"]]
  assert anchor["sweeps"][1]["chosen"] == "0.99" and anchor["sweeps"][0]["chosen"] in anchor["sweeps"][0]["values"]
  wsd = anchor["sweeps"][-1]
  assert set(wsd["values"]) == {run.AS_IS, "0.2", "0.4"}  # cosine as it is, and wsd at each cool-down
  for s in sides.values():
    read = run.read_of(s["published_settings"], s["tuned_read"])
    again = run.side_figures(s["runs"]["published"], s["runs"]["tuned"], read)
    assert again["difference"] == s["difference"] and again["tuned"] == s["tuned"]
    assert s["difference"]["mean"] < 0  # the stub rewards what the search keeps
  written = json.loads((tmp_path / "work" / "knobs-quick.json").read_text())
  assert (tmp_path / "work" / "knobs-quick.md").read_text() == report.markdown(written) + "\n"
  # Each side read on the recipe record's R4 curve, recomputed from the two records; the anchor as
  # published reproduces the record's anchor on a seed only where its loss is the record's, bit for bit.
  recipe = json.loads((tmp_path / "recipe-quick.json").read_text())  # the record the study read
  seeds, n = written["seeds"], written["steps"]
  again = run.anchor_reading(recipe, written["sides"], seeds, n)
  assert again == {k: written[k] for k in ("on_r4_curve", "anchor_reproduced")}
  assert written["anchor_reproduced"] == {str(s): False for s in seeds}
  read = written["on_r4_curve"]["anchor"]
  assert read["tuned"]["mean"] > read["published"]["mean"]  # the tuned anchor's lower loss takes R4 more steps
  recipe["anchor"]["at_n"][str(seeds[0])] = written["sides"]["anchor"]["published"][0]
  assert run.anchor_reading(recipe, written["sides"], seeds, n)["anchor_reproduced"][str(seeds[0])] is True
  assert "bit for bit on seeds none of" in report.markdown(written)


def test_bad_settings_are_refused_naming_the_field(tmp_path):
  c = _config(tmp_path)
  with pytest.raises(ValueError, match=r"--config.benchmark.knobs.set must be one of \['full', 'quick'\], got 'fast'"):
    c.benchmark.knobs.set = "fast"  # at the assignment, as on the command line
  c = _config(tmp_path)
  c.benchmark.knobs.sides = "anchor,adam"
  with pytest.raises(ValueError, match=r"--config.benchmark.knobs.sides='anchor,adam': give sides from"):
    study.validate(c)
  c = _config(tmp_path)
  c.optim.schedule = "wsd"
  with pytest.raises(ValueError, match=r"the knobs study's anchor is R4 \(AdamW, cosine\)"):
    study.validate(c)
  c = _config(tmp_path)
  c.optim.b1 = 0.8
  with pytest.raises(ValueError, match=r"side 'anchor': knob b1=0.8 is the side's own setting"):
    study.validate(c)
  c = _config(tmp_path)  # a record of the first trick list: its LRs were tuned for other rows
  first = json.loads((tmp_path / "recipe-quick.json").read_text()) | {"trick_list": 1}
  (tmp_path / "recipe-first.json").write_text(json.dumps(first))
  c.benchmark.knobs.lrs_from = str(tmp_path / "recipe-first.json")
  with pytest.raises(ValueError, match=r"measured with trick list 1, before today's \(list 2\).*study=recipe"):
    study.validate(c)
  c = _config(tmp_path)  # a record without the Muon row, for the muon side
  partial = json.loads((tmp_path / "recipe-quick.json").read_text())
  partial["tricks"] = ["schedule", "rotary"]
  (tmp_path / "recipe-partial.json").write_text(json.dumps(partial))
  c.benchmark.knobs.lrs_from = str(tmp_path / "recipe-partial.json")
  with pytest.raises(
    ValueError, match=r"holds no 'muon' step .*leave the side out of --config\.benchmark\.knobs\.sides"
  ):
    study.validate(c)
  c = _config(tmp_path)
  c.benchmark.knobs.lrs_from = str(tmp_path / "none.json")
  with pytest.raises(ValueError, match=r"give one with --config.benchmark.knobs.lrs_from"):
    study.validate(c)


@pytest.mark.slow  # the quick search through the skeleton with stub runs
def test_sides_that_coincide_at_a_preset_share_their_runs_and_say_so(tmp_path, monkeypatch, capsys):
  """At `quick` the recipe's trick list ends at its Muon row: the `recipe` and `muon` sides are one
  config with one search, so their runs are the same specs (the run cache trains each once)."""
  c = _config(tmp_path)
  c.benchmark.knobs.set = "quick"
  recipe = json.loads((tmp_path / "recipe-quick.json").read_text())
  recipe["tricks"] = recipe["tricks"][: recipe["tricks"].index("muon") + 1]
  (tmp_path / "recipe-quick.json").write_text(json.dumps(recipe))
  assert run.coinciding_sides(run.side_configs(c)[1], run.knobs_of(c)) == {"recipe": "muon"}
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  result = study.run(c, str(tmp_path / "work"))
  assert result["same_runs"] == {"recipe": "muon"}
  # Each of the recipe side's specs is one of the muon side's: asked by both, one key, one run in a run cache.
  asked = [json.dumps(spec, sort_keys=True) for spec in runner.specs if spec["config"]["optim"]["name"] != "adamw"]
  assert asked and len(asked) >= 2 * len(set(asked))
  assert result["sides"]["recipe"]["published"] == result["sides"]["muon"]["published"]
  assert (
    "--- knobs: side 'recipe' is side 'muon' at this preset: the same runs, trained once" in capsys.readouterr().out
  )
  assert (
    "At `quick` the whole recipe is the recipe's Muon row (the same config and knobs): its runs are the other's, "
    "trained once, and its rows repeat them." in report.markdown(result)
  )
  # Where the sides differ (the full trick list), none coincide.
  (tmp_path / "full").mkdir()
  full = _config(tmp_path / "full")
  assert run.coinciding_sides(run.side_configs(full)[1], run.knobs_of(full)) == {}


def _stub_with_curve(spec):
  """`_stub_result` with its steps and the eval curve the plateau rule reads (as a run gives them)."""
  out = _stub_result(spec)
  steps = spec["config"]["trainer"]["steps"]
  curve = [{"step": steps, "eval_loss_raw": out["final_raw"], "eval_loss_averaged": out["final_raw"]}]
  return out | {"steps": steps, "curve": curve}


def _stub_falling(spec):
  """`_stub_with_curve` whose loss falls with the budget (L = 0.4 (T/300)^-0.5 above its level at 300 steps),
  the recipe's (Muon) 0.15 lower: R4 reaches the recipe's loss at N near 2.6 N."""
  out = _stub_with_curve(spec)
  c = spec["config"]
  shift = 0.4 * ((c["trainer"]["steps"] / 300) ** -0.5 - 1) - 0.15 * (c["optim"]["name"] != "adamw")
  out["final_raw"] += shift
  out["final_averaged"] = {b: x + shift for b, x in out["final_averaged"].items()}
  out["final_averaged_per_batch"] = [out["final_averaged"][str(spec["betas"][0])] + 0.001 * j for j in (-1, 1, -1, 1)]
  return out


def _rows_record(path, seeds, n):
  """A cell `both_tuned` record of two sides on their own curves: AdamW 0.05 below R4's stub curve, Muon 0.1."""
  sides = {}
  for side, offset, budgets in (("adamw", -0.05, (0.75, 1.0, 2.0, 3.0)), ("muon", -0.1, (0.5, 1.0))):
    runs = {}
    for s in seeds:
      for f in budgets:
        loss = 3.0 + 0.01 * s + 0.4 * (f**-0.5 - 1) + offset
        runs[f"{s}/{round(f * n)}"] = {"seed": s, "steps": round(f * n), "final_raw": loss}
    settings = {"row": side, "lr": 0.004, "beta": 0.99, "iterate": "raw", "weight_decay": 0.0}
    sides[side] = {"settings": settings, "budgets": list(budgets), "runs": runs}
  path.write_text(json.dumps({"cell": {"name": "both_tuned"}, "steps": n, "seeds": seeds, "sides": sides}))
  return str(path)


@pytest.mark.slow  # the joint search of every side through the skeleton on stub runs (seconds)
def test_the_joint_tuner_searches_every_side_alike_then_runs_the_headline(tmp_path, monkeypatch):
  runner = SpecRunner(_stub_falling)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  # The step timing stubbed: the recipe's step a quarter slower than R4's
  monkeypatch.setattr(curves.timing, "time_baselines", lambda e: {"ms_per_step": {"anchor": 10.0, "recipe": 12.5}})
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.knobs.sides = "anchor,recipe"  # R4 and the whole recipe (its head untied), searched alike
  c.benchmark.knobs.rows_from = _rows_record(tmp_path / "rows.json", list(c.benchmark.seeds), 300)
  c.benchmark.knobs.anchor_extensions = (3.0, 4.0, 6.0)
  result = study.run(c, str(tmp_path / "work"))
  sides = result["sides"]
  assert result["tuner"] == "joint"
  costs = {s["tuning_runs"] for s in sides.values()}
  assert max(costs) - min(costs) < 2  # equal cost, within one configuration (two N runs)
  for s in sides.values():
    assert s["search"]["totals"] == {name: other["tuning_runs"] for name, other in sides.items()}
    assert s["search"]["settings"][0]["origin"] == "published" and s["sweeps"] == []
    assert s["tuned_lr"] == s["search"]["chosen"]["fields"]["optim.learning_rate"]
    assert s["difference"]["rule"] == "t"
  searched = {r["seed"] for s in sides.values() for r in s["search"]["runs"]}
  assert searched <= {1001, 1002, 1003, 1004} and not searched & set(result["seeds"])
  # The anchor's search finds the stub's b2 (0.99 lowers AdamW's loss), within its space.
  assert sides["anchor"]["tuned_fields"].get("optim.b2", 0.95) != 0.95 or sides["anchor"]["difference"]["mean"] <= 0
  # Then each side's curves at its chosen and at its raw-chosen setting, read on its own curve: R4 reaches the
  # recipe's loss at N near 2.6 N (the stub's), and the rows are read on R4's curve from their record.
  primary = result["curves"]["primary"]
  assert primary["extended"]["anchor"]  # R4's curve extended until it spans the recipe's loss at N
  assert 2.0 < primary["factor"]["a"]["mean"] < 6.0
  assert {k: primary[k] for k in ("factor", "interpolated")} == {
    k: v for k, v in comparison.own_curves(primary, "anchor", "recipe", None).items() if k in ("factor", "interpolated")
  }
  assert (
    primary["verdict"] == primary["verdict_against_one"]["verdict"] and primary["verdict_against_one"]["field"] is None
  )
  seconds, a = primary["seconds"], primary["factor"]["a"]
  assert seconds["step_time_ratio"] == 0.8 and seconds["mean"] == pytest.approx(0.8 * a["mean"])
  assert seconds["ci95"] == pytest.approx([0.8 * x for x in a["ci95"]])
  assert {s["settings"]["iterate"] for s in result["curves"]["raw"]["sides"].values()} == {"raw"}
  curve_seeds = {
    r["seed"] for spec in runner.specs for r in [spec["config"]] if spec["config"]["trainer"]["steps"] != 300
  }
  assert curve_seeds <= {1001, 1002, 1003} | set(result["seeds"]) | {23}
  rows = result["curves"]["rows"]
  assert rows == curves.rows_on_r4(
    primary,
    {str(s): x for s, x in zip(result["seeds"], sides["anchor"]["published"])},
    json.loads(open(c.benchmark.knobs.rows_from).read()),
  ) | {"rows_from": c.benchmark.knobs.rows_from}
  assert rows["muon"]["a"]["mean"] > rows["adamw"]["a"]["mean"] > 1.0
  written = json.loads((tmp_path / "work" / "knobs-joint-quick.json").read_text())
  md = (tmp_path / "work" / "knobs-joint-quick.md").read_text()
  assert md == report.markdown(written) + "\n" and "tuning runs (N-run equivalents)" in md
  assert "## Rows read on the jointly searched R4's curve" in md and "No field figure" in md
  assert f"{seconds['mean']:.2f}× [{seconds['ci95'][0]:.2f}, {seconds['ci95'][1]:.2f}]" in md
  # A search finished elsewhere is taken from its record as it chose: nothing is searched again, the same curves.
  again = SpecRunner(_stub_falling)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(again))
  c.benchmark.knobs.search_from = str(tmp_path / "work" / "knobs-joint-quick.json")
  taken = study.run(c, str(tmp_path / "again"))
  assert not [x for x in again.specs if x["config"]["trainer"]["steps"] == 300 and x["config"]["seed"] > 1000]
  assert taken["curves"]["primary"]["factor"] == primary["factor"]
  assert {s: x["search"] for s, x in taken["sides"].items()} == {s: x["search"] for s, x in written["sides"].items()}
  c.benchmark.knobs.sides = "anchor,muon,recipe"  # sides the record does not hold
  with pytest.raises(ValueError, match=r"--config\.benchmark\.knobs\.search_from=.*sides \['anchor', 'recipe'\]"):
    study.validate(c)


def test_the_curves_step_timing_is_taken_again_once_where_the_machine_was_not_quiet(monkeypatch):
  sides = [comparison.Side(name, {"name": name}, {"lr": 0.01, "beta": 0.99}, [1.0]) for name in curves.PAIR]
  timed = []
  monkeypatch.setattr(curves.timing, "time_baselines", lambda e: timed.append(sorted(e)) or {"ms_per_step": {}})
  for load, times in ((1.9, 1), (3.1, 2)):
    timed.clear()
    monkeypatch.setattr(curves.os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert curves.time_steps(None, {"curves": {"primary": {"sides": sides}}})["load_average_1m"] == load
    assert timed == [sorted(curves.PAIR)] * times
  assert curves.time_steps(None, {}) == {}  # no curves (the coordinate search): nothing timed


def test_the_joint_tuners_curves_are_refused_without_the_record_their_rows_read(tmp_path):
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.knobs.sides = "anchor,recipe"
  c.benchmark.knobs.rows_from = str(tmp_path / "missing.json")  # given: refused (the published one at a preset
  # that has none: the rows are left out, and the page says so)
  with pytest.raises(ValueError, match=r"--config\.benchmark\.knobs\.rows_from: no cell 'both_tuned' record"):
    study.validate(c)
  c.benchmark.knobs.rows_from = _rows_record(tmp_path / "rows.json", [1, 2], 300)
  c.benchmark.knobs.recipe_budgets = (0.5, 0.75)  # no N: neither reading could be made at N
  with pytest.raises(ValueError, match=r"--config\.benchmark\.knobs\.recipe_budgets=\(0\.5, 0\.75\).*N \(1\.0\)"):
    study.validate(c)


def test_the_joint_tuners_seeds_are_refused_where_they_could_tune_on_a_headline_seed(tmp_path):
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.knobs.search_seeds = (1001, 1002, 1)
  with pytest.raises(ValueError, match=r"--config\.benchmark\.knobs\.search_seeds=\(1001, 1002, 1\).*headline seed"):
    study.validate(c)
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"  # the whole recipe's head is untied: searched in the symmetric space, not in 'v1'
  study.validate(c)
  c.benchmark.knobs.search_space = "v1"
  with pytest.raises(ValueError, match=r"side 'recipe': --config\.model\.untied_head=True: .*leave it out of"):
    study.validate(c)


def test_only_the_headline_seeds_the_recipe_records_curve_holds_are_read_on_it():
  """A run on fresh headline seeds (the joint campaign's 21-25) has no R4 curve in the recipe record: no
  reading on it, not a KeyError after every run has trained; seeds it partly holds are read and named."""
  curves = {str(s): {"steps": [150, 300, 600], "loss": [3.2, 3.0, 2.8]} for s in (1, 2)}
  recipe = {"anchor": {"curves": curves, "at_n": {"1": 3.0, "2": 3.0}}}
  sides = {"anchor": {"published": [3.0, 2.9, 3.1], "tuned": [2.9, 2.8, 3.0]}}
  assert run.anchor_reading(recipe, sides, [21, 22, 23], 300) == {"on_r4_curve": None, "anchor_reproduced": None}
  part = run.anchor_reading(recipe, sides, [1, 22, 2], 300)
  assert part["on_r4_curve_seeds"] == [1, 2] and part["anchor_reproduced"] == {"1": True, "2": False}
  per_seed = part["on_r4_curve"]["anchor"]["published"]["per_seed"]
  assert per_seed[0] == 1.0 and 0.5 < per_seed[1] < 1.0  # seed 1 at N; seed 2 short of it (3.1 between 3.2 and 3.0)
  md = report.markdown(
    {
      "tuner": "lr",
      "preset": "quick",
      "lrs_from": "r",
      "steps": 300,
      "seeds": [21, 22, 23],
      "tuning_seeds": [1001],
      "sides": {},
      "on_r4_curve": None,
      "anchor_reproduced": None,
    }
  )
  assert "holds none of the headline seeds [21, 22, 23]: no side is read on it" in md


def test_a_finished_search_given_to_the_coordinate_search_is_refused(tmp_path):
  c = _config(tmp_path)  # tuner 'lr': it would search anyway, and the record given would do nothing
  c.benchmark.knobs.search_from = str(tmp_path / "knobs-joint-quick.json")
  with pytest.raises(ValueError, match=r"knobs\.search_from=.*has no effect: tuner 'lr' does not read it.*tuner"):
    study.validate(c)
