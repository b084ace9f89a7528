"""Cell `sides` of the optimizers study on stub runs (nothing trains): any optimizer, a built-in by name or a
user's module by dotted path, searched alike with the reference AdamW and read against it, each side's
plain dict with Holm-adjusted verdicts; a module with a broken space refused before anything trains."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re

import pytest
from conftest import ROOT, SpecRunner
from test_optimizers import N, _config, _stub_result

from hybridjax.bench import study
from hybridjax.bench.studies.optimizers import sides

CAUTIOUS = "experiments.cautious_adamw"
SPEED = {"adamw": 1.0, "lion": 1.0, CAUTIOUS: 1.5}  # the stub's factor of each over AdamW
BEST_LR = {"adamw": 0.012, "lion": 0.0024, CAUTIOUS: 0.012}


def _stub(spec):
  """L = 2.5 + 0.8 (s T/N)^-0.7 per seed, s its optimizer's `SPEED` up or down by seed (Lion's by 5% about
  1.0x, told from nothing; Cautious AdamW's by 1% about 1.5x), 0.02 a sqrt(2) step from its best LR; a step
  costs 1.2 s under Cautious AdamW, 1 s else."""
  c = spec["config"]
  name, steps, lr, seed = c["optim"]["name"], c["trainer"]["steps"], c["optim"]["learning_rate"], c["seed"]
  speed = SPEED[name] * (1 + {"adamw": 0.0, "lion": 0.05, CAUTIOUS: 0.01}[name] * (-1) ** seed)
  loss = 2.5 + 0.8 * (speed * steps / N) ** -0.7 + 0.01 * (seed % 100)
  loss += 0.02 * abs(math.log(lr / BEST_LR[name]) / math.log(math.sqrt(2)))
  return {
    "seed": seed,
    "steps": steps,
    "lr": lr,
    "curve": [{"step": steps, "eval_loss_raw": loss + 0.01, "eval_loss_averaged": loss}],
    "final_raw": loss + 0.01,
    "final_averaged": {str(b): loss for b in spec["betas"]},
    "final_averaged_per_batch": [loss + 0.02 * (-1) ** j for j in range(2 * c["trainer"]["eval_batches"])],
    "train_s": steps * (1.2 if name == CAUTIOUS else 1.0),
  }


def test_any_optimizer_is_judged_against_the_reference_with_holm_adjusted_verdicts(tmp_path, monkeypatch):
  runner = SpecRunner(_stub)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.optimizers.draws = 200
  table = sides.judge(c, str(tmp_path / "work"), f"adamw,lion,{CAUTIOUS}")
  assert list(table) == ["lion", CAUTIOUS]
  fast, lion = table[CAUTIOUS], table["lion"]
  assert fast["verdict"] == "above 1.0×" and abs(math.log(fast["primary"]["a"]["factor"] / 1.5)) < 0.1
  assert lion["verdict"] == "undetermined" and lion["primary"]["a"]["ci95"][0] < 1 < lion["primary"]["a"]["ci95"][1]
  assert lion["smallest_tellable"] > 1 and fast["p_holm"] < 0.05 <= lion["p_holm"]
  assert fast["step_time_ratio"] == pytest.approx(1.2) and lion["step_time_ratio"] == pytest.approx(1.0)
  for row in table.values():  # searched alike at equal cost (within a configuration), never on a headline seed
    assert abs(row["tuning_runs"] - row["reference_tuning_runs"]) < 2 and row["tuning_curve"]
    assert row["seeds"] == [21, 22] and row["model_free"]["a"]["factor"] > 0 and row["raw"]["b"]["ci95"]
  assert abs(math.log(table["lion"]["chosen"]["optim.learning_rate"] / 0.0024)) < 0.2
  assert "optim.module.b1" in fast["chosen"]
  searched = {s["config"]["seed"] for s in runner.specs if s["config"]["trainer"]["steps"] == N}
  assert {1001, 1002, 1003} <= searched
  # resumed: the record's table is the function's, and the page names what each side lacks
  written = json.loads((tmp_path / "work" / "optimizers-sides-quick.json").read_text())
  assert written["table"] == json.loads(json.dumps(table))
  page = (tmp_path / "work" / "optimizers-sides-quick.md").read_text()
  assert "| lion |" in page and "eps: a sign update divides by nothing" in page


def test_a_module_with_a_broken_space_is_refused_before_anything_trains(tmp_path, monkeypatch):
  (tmp_path / "broken_opt.py").write_text(
    "import optax\nCONFIG = {'b1': 0.9}\nSPACE = {'learning_rate': {'min': 1e-3, 'max': 1e-2, 'scaling': 'log'}, "
    "'gamma': {'feasible_points': [1.0]}}\ndef optimizer(learning_rate, b1):\n  return optax.adam(learning_rate, b1)\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  runner = SpecRunner(_stub)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  with pytest.raises(ValueError, match=r"optimizers\.sides: .*SPACE\['gamma'\] is a knob its optimizer\(\) does not"):
    sides.judge(c, str(tmp_path / "work"), "adamw,broken_opt")
  assert runner.ran == 0 and not (tmp_path / "work").exists()


def test_the_header_names_the_sides_against_the_reference(tmp_path):
  from hybridjax.bench.studies.optimizers import run

  c = _config(tmp_path)
  c.benchmark.optimizers.update(cell="sides", sides=f"adamw,lion,{CAUTIOUS}")
  line = run.header(c, "w")[0]
  assert f"the reference AdamW (row {c.benchmark.optimizers.adamw_row}) against lion, {CAUTIOUS}" in line
  assert "(Muon)" not in line


def test_a_misspelt_side_is_refused_with_the_built_in_it_is_near(tmp_path, monkeypatch):
  runner = SpecRunner(_stub)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  with pytest.raises(ValueError, match=r"optimizers\.sides: .*'lino' names no built-in.*\(did you mean 'lion'\?\)"):
    sides.judge(_config(tmp_path), str(tmp_path / "work"), "adamw,lino")
  assert runner.ran == 0


@pytest.mark.slow  # the documented command on stub runs, then one real run of Cautious AdamW (a minute)
def test_the_documented_command_judges_cautious_adamw_at_quick(tmp_path, monkeypatch, capsys):
  """docs/benchmark.md's command at `quick` (its `--config.benchmark.*` fields on the quick config) on stub
  runs prints the per-side dict as JSON; then one of the runs it asked for trains for real under the
  module's optimizer, and its loss falls below a uniform guess over the bytes."""
  from experiments import benchmark
  from hybridjax.bench.runs.anchor_run import run_anchor

  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = f.read()
  command = re.search(r"python -m experiments\.benchmark --config=\S+:long [^`]*?--json[^\n]*", page).group(0)
  args = command.replace("\\\n", " ").split()
  c = _config(tmp_path)
  for a in args:
    if a.startswith("--config.benchmark."):
      c.update_from_flattened_dict(dict([a[len("--config.") :].split("=", 1)]))
  assert c.benchmark.optimizers.sides == f"adamw,lion,{CAUTIOUS}" and "--json" in args
  runner = SpecRunner(_stub)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  benchmark.print_result(c, str(tmp_path / "work"), command, [], True)
  table = json.loads(capsys.readouterr().out)
  assert list(table) == ["lion", CAUTIOUS] and table[CAUTIOUS]["verdict"] == "above 1.0×"
  spec = next(s for s in runner.specs if s["config"]["optim"]["name"] == CAUTIOUS and s["config"]["seed"] == 21)
  out = run_anchor(spec)
  assert math.isfinite(out["final_raw"]) and out["final_raw"] < math.log(256)


def test_the_page_shows_the_user_module_as_the_file_is():
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = f.read()
  with open(os.path.join(ROOT, "experiments", "cautious_adamw.py")) as f:
    source = f.read()
  assert f"```python\n{source}```" in page and 20 <= len(source.splitlines()) <= 40
  assert f"a module of {len(source.splitlines())} lines" in " ".join(page.split())


def _kept(cache):
  """The stubs (`_stub` for the sides' optimizers, the optimizers study's for Muon), each result keyed and
  kept in `cache`, as a run cache beside its record keeps it."""

  def run(spec):
    result = (_stub if spec["config"]["optim"]["name"] in SPEED else _stub_result)(spec)
    result["key"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    (cache / f"{result['key']}.json").write_text(json.dumps(result))
    return result

  return run


def test_the_reference_read_from_a_both_tuned_record_is_never_re_run(tmp_path, monkeypatch):
  """`reference_from`: the reference is the record's AdamW side with its runs from the cache beside it; none
  of its runs trains again, nor its search, and the sides' searches spend at least what its search spent. A
  record of another N is refused, naming the field."""
  work = tmp_path / "published"
  (work / "both_tuned-quick-run-cache").mkdir(parents=True)
  runner = SpecRunner(_kept(work / "both_tuned-quick-run-cache"))
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  c.benchmark.tuner = "joint"
  c.benchmark.optimizers.update(draws=200, cell="both_tuned")
  before = study.run(c, str(work))["sides"]["adamw"]
  runner.specs.clear()
  # a budget the record did not re-check (as the published record's 0.75 N and 1.5 N) is not re-checked here
  path = work / "optimizers-both_tuned-quick.json"
  record = json.loads(path.read_text())
  assert record["sides"]["adamw"]["rechecks"].pop("0.75")
  path.write_text(json.dumps(record))
  c = _config(tmp_path)
  c.benchmark.optimizers.update(draws=200, reference_from=str(work / "optimizers-both_tuned-quick.json"))
  table = sides.judge(c, str(tmp_path / "work"), "adamw,lion")
  adamw = [
    (s["config"]["seed"], s["config"]["trainer"]["steps"])
    for s in runner.specs
    if s["config"]["optim"]["name"] == "adamw"
  ]
  assert not {seed for seed, _ in adamw} & {1001, 1002, 1003, 1004}
  assert not set(adamw) & {(r["seed"], r["steps"]) for r in before["runs"].values()}
  assert {steps for _, steps in adamw} <= {round(f * N) for f in c.benchmark.optimizers.adamw_extensions}
  row = table["lion"]
  assert row["reference_tuning_runs"] == before["tuning_runs"] and before["tuning_runs"] - 2 < row["tuning_runs"]
  c.trainer.steps = 2 * N
  with pytest.raises(ValueError, match=r"optimizers\.reference_from=.* is a record at preset 'quick', N=40"):
    sides.judge(c, str(tmp_path / "work"), "adamw,lion")
