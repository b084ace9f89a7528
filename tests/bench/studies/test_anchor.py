"""The anchor study through the skeleton with a stub runner (nothing trains): R4's beta2 x weight decay x LR
grid on the tuning seeds, the best against R4's own, the record's figures recomputed from its runs."""

from __future__ import annotations

import contextlib
import json

import pytest
from conftest import SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import study
from hybridjax.bench.studies.anchor import run


def _config(tmp_path):
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "anchor"
  recipe = {"trick_list": 2, "tricks": [], "step_runs": {}, "anchor": {"lr": 0.01, "beta": 0.99}}
  recipe["config"] = {"optim": {"b2": 0.95, "weight_decay": 0.1}}
  path = tmp_path / "recipe-quick.json"
  path.write_text(json.dumps(recipe))
  c.benchmark.anchor.lrs_from = str(path)
  return c


def _stub(gain):
  """R4's own setting at 2.0 + 0.01 per seed; beta2 0.999 `gain` lower; every other LR or weight decay
  0.02 higher. Every eval window scores the run's loss +- 0.01."""

  def result(spec):
    c = spec["config"]
    o = c["optim"]
    loss = 2.0 + 0.01 * (c["seed"] - 1001) - (gain if o["b2"] == 0.999 else 0.0)
    loss += 0.02 * (o["learning_rate"] != 0.01) + 0.02 * (o["weight_decay"] != 0.1)
    windows = [loss + 0.01 * (-1) ** j for j in range(4)]
    return {
      "seed": c["seed"],
      "steps": c["trainer"]["steps"],
      "lr": o["learning_rate"],
      "final_raw": loss + 0.01,
      "final_averaged": {str(b): loss for b in spec["betas"]},
      "final_averaged_per_batch": windows,
    }

  return result


@pytest.mark.parametrize("gain, verdict", [(0.03, "lower"), (0.0, "R4's own setting is the best")])
def test_the_grid_runs_on_tuning_seeds_and_judges_the_best_against_r4s_own(tmp_path, monkeypatch, gain, verdict):
  runner = SpecRunner(_stub(gain))
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = _config(tmp_path)
  result = study.run(c, str(tmp_path / "work"))
  # 2 beta2 x 2 weight decays x 3 LRs, R4's own first, each on the three tuning seeds alone
  assert len(result["tried"]) == 12 and result["tuning_runs"] == 36
  assert {k: result["tried"][0][k] for k in ("b2", "weight_decay", "lr")} == {
    "b2": 0.95,
    "weight_decay": 0.1,
    "lr": 0.01,
  }
  assert {s["config"]["seed"] for s in runner.specs} == {1001, 1002, 1003}
  f = result["figures"]
  assert f["verdict"] == verdict
  if gain:
    assert result["tried"][f["best"]]["b2"] == 0.999 and f["difference"]["mean"] == pytest.approx(-gain)
  written = json.loads((tmp_path / "work" / "anchor-quick.json").read_text())
  assert json.loads(json.dumps(run.figures(written))) == written["figures"]
  md = (tmp_path / "work" / "anchor-quick.md").read_text()
  assert md == run.markdown(written) + "\n" and ("**lower**" in md) == bool(gain)


def test_bad_blocks_are_refused_naming_the_field(tmp_path):
  for fields, match in (
    ({"b2s": (0.9, 0.999)}, r"anchor\.b2s=\(0\.9, 0\.999\): give distinct values, R4's own \(0\.95\) among them"),
    ({"weight_decays": (0.2,)}, r"anchor\.weight_decays=.*R4's own \(0\.1\)"),
    ({"seeds": (1001,)}, r"anchor\.seeds=.*2 seeds or more"),
    ({"lrs_from": str(tmp_path / "none.json")}, r"no recipe record at .*benchmark\.anchor\.lrs_from"),
  ):
    c = _config(tmp_path)
    c.benchmark.anchor.update(fields)
    with pytest.raises(ValueError, match=match):
      study.validate(c)
  c = _config(tmp_path)
  c.optim.b2 = 0.999
  c.benchmark.anchor.b2s = (0.95, 0.999)
  with pytest.raises(ValueError, match=r"--config\.optim\.b2=0\.999 \(R4 ran 0\.95\): the anchor study re-checks R4"):
    study.validate(c)
