"""Publishing (`benchmark.publish`) never replaces or mixes a published record of another config: the
study's validate hook refuses such a folder before anything trains, and its write refuses it again
(after the workdir's copy is written). Nothing here trains: the records are stubs."""

from __future__ import annotations

import json
import os
import shlex

import pytest
from conftest import ROOT

from experiments.configs import benchmark as benchmark_cfg
from hybridjax import config as config_lib
from hybridjax.bench import record, specs, speedrun, study
from hybridjax.bench.studies.family import config as family_config
from hybridjax.bench.studies.family import report as family_report
from hybridjax.bench.studies.ladder import config as ladder_config
from hybridjax.bench.studies.ladder import rungs as ladder_rungs

PUBLISHED = os.path.join(ROOT, "docs", "results")
REFUSAL = r"(?s)--config\.benchmark\.publish=.*another folder.*deliberately"


def _config(preset: str, **fields) -> object:
  c = benchmark_cfg.get_config(preset)
  c.update_from_flattened_dict(fields)
  return c


def _store(path, data: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f)


def _ladder_record(config, rungs: list[str]) -> dict:
  """A stub of a published ladder of `config` that ran `rungs`: what its join reads."""
  return {
    "config": json.loads(config.to_json()),
    "rung_names": rungs,
    "groups": {ladder_rungs.RUNGS[r].group: {} for r in rungs},
  }


def test_a_ladder_of_another_config_or_a_rung_run_again_is_refused_before_training(tmp_path):
  folder, work = tmp_path / "ladder", tmp_path / "work"
  c = _config("quick", **{"benchmark.study": "ladder", "benchmark.publish": str(folder)})
  wider = _config("quick", **{"benchmark.study": "ladder", "model.d_model": c.model.d_model * 2})
  _store(str(folder / "ladder-quick.json"), _ladder_record(wider, ["R0"]))
  with pytest.raises(ValueError, match=REFUSAL) as e:
    study.run(c, str(work))
  d = c.model.d_model
  assert f"a ladder of another config (model.d_model: {2 * d} there, {d} here)" in str(e.value)
  assert not work.exists()  # refused before anything was made
  same = _config("quick", **{"benchmark.study": "ladder", "benchmark.workers": 3})  # a runtime field differs
  _store(str(folder / "ladder-quick.json"), _ladder_record(same, ["R2"]))
  study.validate(c)  # R2 (its own group) is not among quick's rungs (R1, R3, R6): it joins
  _store(str(folder / "ladder-quick.json"), _ladder_record(same, ["R2", "R3"]))
  with pytest.raises(ValueError, match=r"ran \['R3', 'cosine'\] already"):
    study.validate(c)


def test_a_ladder_is_refused_where_a_family_folder_beside_it_holds_another_config(tmp_path):
  folder = tmp_path / "ladder"
  c = _config("quick", **{"benchmark.study": "ladder", "benchmark.publish": str(folder)})
  cosine = ladder_rungs.group_config(c, "cosine", list(c.benchmark.seeds))
  target = ladder_config.family_folder(str(folder), "quick", cosine.benchmark.family)
  _store(os.path.join(target, "benchmark.json"), {"config": json.loads(cosine.to_json())})
  study.validate(c)  # the ladder's own family of the same config: a re-run replaces it
  other = ladder_rungs.group_config(_config("quick", **{"trainer.batch_size": 4}), "cosine", list(c.benchmark.seeds))
  _store(os.path.join(target, "benchmark.json"), {"config": json.loads(other.to_json())})
  with pytest.raises(ValueError, match=REFUSAL) as e:
    study.validate(c)
  assert "trainer.batch_size: 4 there, 8 here" in str(e.value) and "quick-adamw-cosine" in str(e.value)


def test_a_quick_family_is_refused_publishing_into_a_long_familys_folder(tmp_path):
  """The folder holds the published long AdamW-cosine results; the quick preset's are refused before
  training, naming the preset first; the folder is left as it was."""
  folder, work = tmp_path / "long-adamw-cosine", tmp_path / "work"
  with open(os.path.join(PUBLISHED, "long-adamw-cosine", "benchmark.json")) as f:
    _store(str(folder / "benchmark.json"), {"config": json.load(f)["config"]})
  before = (folder / "benchmark.json").read_bytes()
  c = _config("quick", **{"benchmark.publish": str(folder)})
  with pytest.raises(ValueError, match=REFUSAL) as e:
    study.run(c, str(work))
  assert "another config (benchmark.preset: 'long' there, 'quick' here; trainer.steps: 3000 there" in str(e.value)
  assert not work.exists() and (folder / "benchmark.json").read_bytes() == before
  (tmp_path / "hand").mkdir()
  (tmp_path / "hand" / "results.md").write_text("written by hand")  # results with no record to compare
  with pytest.raises(ValueError, match=r"holds .*results\.md, with no benchmark\.json"):
    study.validate(_config("quick", **{"benchmark.publish": str(tmp_path / "hand")}))


def test_a_family_publishes_over_its_own_config_only(tmp_path):
  """`publish_results` (the write's check): the same config replaces the folder's files; another is
  refused with nothing copied, the workdir's files kept."""
  work, folder = tmp_path / "work", tmp_path / "pub"
  work.mkdir()
  for name in ("benchmark.json", "headline.json", "results.md", "budget_curve.png"):
    (work / name).write_text(f"new {name}")
  quick = json.loads(_config("quick").to_json())
  plots = [str(work / "budget_curve.png")]
  _store(str(folder / "benchmark.json"), {"config": quick})
  family_report.publish_results({"config": quick}, str(work), str(folder), plots)
  assert (folder / "results.md").read_text() == "new results.md"
  _store(str(folder / "benchmark.json"), {"config": json.loads(_config("tiny").to_json())})
  with pytest.raises(ValueError, match=r"(?s)benchmark\.preset: 'tiny' there, 'quick' here.*Nothing was published"):
    family_report.publish_results({"config": quick}, str(work), str(folder), plots)
  assert json.loads((folder / "benchmark.json").read_text())["config"]["benchmark"]["preset"] == "tiny"
  assert (work / "benchmark.json").read_text() == "new benchmark.json"


def test_a_recipe_of_another_config_is_refused_and_its_record_stays(tmp_path):
  folder, work = tmp_path / "recipe", tmp_path / "work"
  c = _config("quick", **{"benchmark.study": "recipe", "benchmark.publish": str(folder)})
  other = _config("quick", **{"benchmark.recipe.muon_lr": 0.05})
  _store(str(folder / "recipe-quick.json"), {"config": json.loads(other.to_json()), "preset": "quick"})
  with pytest.raises(ValueError, match=r"(?s)benchmark\.recipe\.muon_lr: 0\.05 there, 0\.02 here.*deliberately"):
    study.validate(c)
  result = {"config": json.loads(c.to_json()), "preset": "quick"}
  with pytest.raises(ValueError, match="Nothing was published"):
    record.write_and_publish(result, str(work), str(folder), "recipe-{preset}.json", lambda r: "")
  assert json.loads((folder / "recipe-quick.json").read_text())["config"]["benchmark"]["recipe"]["muon_lr"] == 0.05
  assert (work / "recipe-quick.json").exists()


def test_a_publish_folder_that_cannot_be_made_says_where_the_results_are(tmp_path):
  """A publish folder that cannot be made (under a file here) is refused at the write as another config's
  record is: the OS's reason, nothing published, and where the invocation's results are."""
  work, blocker = tmp_path / "work", tmp_path / "a-file"
  blocker.write_text("not a folder")
  quick = json.loads(_config("quick").to_json())
  with pytest.raises(ValueError, match=rf"(?s)a-file.*Nothing was published; this invocation's results are in {work}$"):
    record.write_and_publish(
      {"config": quick, "preset": "quick"}, str(work), str(blocker / "pub"), "r-{preset}.json", str
    )
  assert (work / "r-quick.json").exists()
  work.joinpath("results.md").write_text("results")
  with pytest.raises(ValueError, match=rf"(?s)a-file.*Nothing was published; the results are in {work}$"):
    family_report.publish_results({"config": quick}, str(work), str(blocker / "pub"), [])


def test_an_old_records_config_compares_in_todays_shape():
  """A record written before a field existed compares it as its default, or not at all where it has
  none (a benchmark field added since); the velocity method's old flat fields and the '' method."""
  today = json.loads(_config("quick").to_json())
  old = json.loads(json.dumps(today))
  del old["model"]["rotary"], old["benchmark"]["iterate"], old["hybrid"]["velocity"]["divergence_tolerance"]
  old["hybrid"].update(method="velocity", divergence_tolerance=today["hybrid"]["velocity"]["divergence_tolerance"])
  assert record.config_differences(old, today) == []
  old["hybrid"]["divergence_tolerance"] = 0.5
  old["model"]["rotary"] = True
  assert record.config_differences(old, today) == [
    "hybrid.velocity.divergence_tolerance: 0.5 there, 0.05 here",
    "model.rotary: True there, False here",
  ]


def _command_config(command: str):
  """The config `command` (one invocation, as a record holds it) gives today; its overrides here set
  string fields only."""
  argv = specs.current_names(shlex.split(command)[3:])
  (config_arg,) = [a for a in argv if a.startswith("--config=")]
  c = benchmark_cfg.get_config(config_arg.split(":", 1)[1])
  fields = dict(a[len("--config.") :].split("=", 1) for a in argv if a.startswith("--config."))
  assert all(isinstance(config_lib.flatten(c)[k], str) for k in fields), fields
  c.update_from_flattened_dict(fields)
  return speedrun.keep_command_line(c, list(fields))


def test_the_published_ladders_join_what_their_commands_give():
  """Each published ladder's config against the config each of its commands gives today (the rungs
  it ran aside): `long`'s both invocations join, and its AdamW and Muon families are the ladder's
  groups; `tiny` ran R6 alone."""
  for name in ("ladder-long.json", "ladder-tiny.json"):
    with open(os.path.join(PUBLISHED, "ladder", name)) as f:
      published = json.load(f)
    stored = record.stored_config(published)
    for command in published["command"].split("; "):
      lines = record.config_differences(stored, _command_config(command), ladder_config.JOIN_IGNORES)
      assert lines == [], (name, command, lines)
  with open(os.path.join(PUBLISHED, "ladder", "ladder-long.json")) as f:
    first = json.load(f)["command"].split("; ")[0]  # R0-R5, which wrote the families
  c = _command_config(first)
  for group in ("cosine", "muon"):
    config = ladder_rungs.group_config(c, group, list(c.benchmark.seeds))
    folder = os.path.join(PUBLISHED, f"long-{config.benchmark.family}")
    family_config.check_publish(config, folder)  # raises where they differ
    with open(os.path.join(folder, "benchmark.json")) as f:
      assert json.load(f)["command"] == first
