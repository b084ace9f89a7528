"""The comparison blocks (`bench.comparison`) carry a whole study: one more optimizer against AdamW, each on
its own budget curve, declared in a few dozen lines over them and run through the skeleton on stub runs."""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap

import pytest
from conftest import SpecRunner

from experiments.configs import benchmark as benchmark_cfg
from hybridjax.bench import study

K = 2.0  # the stub's other optimizer reaches AdamW's loss in K times fewer steps

CONFIG = """
from hybridjax import schema
from hybridjax.bench import comparison

F = schema.Field
FIELDS = (
  F("b1", 0.5, schema.check_num(0.0, 1.0), "the other side's beta1"),
  F("seeds", (21, 22), schema.check_int_tuple(0), "the headline seeds"),
  F("plateau_seeds", (23,), schema.check_int_tuple(0), "the seeds the plateau rule adds"),
  F("tuning_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the re-checks' seeds"),
  F("search_seeds", (1001, 1002, 1003), schema.check_int_tuple(0), "the search's seeds"),
  F("spare_seed", 1004, schema.check_int(0), "the search's spare seed"),
  F("adamw_budgets", (0.75, 1.0, 2.0, 3.0), schema.check_num_tuple(0.0), "AdamW's budgets (x N)"),
  F("adamw_extensions", (4.0,), schema.check_num_tuple(0.0), "added until below the other's loss at N"),
  F("other_budgets", (0.75, 1.0), schema.check_num_tuple(0.0), "the other side's budgets (x N)"),
  F("other_extensions", (0.5, 0.25), schema.check_num_tuple(0.0), "added until it reaches AdamW's at N"),
  F("wide_eval", 0, schema.check_int(0), "no wider eval"),
  F("draws", 200, schema.check_int(100), "the bootstrap's draws"),
  F("bootstrap_seed", 0, schema.check_int(0), "the bootstrap's seed"),
)


def add_defaults(block, preset):
  block.update(schema.block(FIELDS))


def validate(config):
  o, n = config.benchmark.toy_optimizer, int(config.trainer.steps)
  errors = comparison.seed_errors("toy_optimizer", o)
  errors += comparison.budget_errors("toy_optimizer", "adamw", o, n, True)
  errors += comparison.budget_errors("toy_optimizer", "other", o, n, False)
  if errors:
    raise ValueError("; ".join(errors))
  return {}
"""

RUN = """
from hybridjax.bench import comparison, search
from hybridjax.bench.studies import Study


def header(config, workdir):
  return [f"toy optimizer {config.benchmark.preset}; workdir {workdir}"]


def train(config, runner):
  o, sides = config.benchmark.toy_optimizer, []
  for name in ("adamw", "other"):
    c = search.apply_setting(config, {"optim.b1": float(o.b1)} if name == "other" else {})
    settings = {"row": name, "lr": float(c.optim.learning_rate), "beta": 0.99, "iterate": "averaged"}
    settings["weight_decay"] = search.weight_decay_of(c)[1]
    sides.append(comparison.Side(name, c, settings, [float(f) for f in o[f"{name}_budgets"]]))
  return comparison.spanned(config, *sides, o, runner, "toy") | {"sides": sides}


def record(config, trained, timed, command, runner):
  o, n, seeds = config.benchmark.toy_optimizer, int(config.trainer.steps), trained["seeds"]
  result = comparison.code_record(config) | {
    "cell": {"name": "toy", "preset": str(config.benchmark.preset)},
    "steps": n,
    "seeds": seeds,
    "draws": int(o.draws),
    "bootstrap_seed": int(o.bootstrap_seed),
    "readings": 2,
    "extended": trained["extended"],
    "sides": {side.name: side.record(seeds, n) for side in trained["sides"]},
  }
  return result | comparison.own_curves(result, "adamw", "other", (1.1, 1.4))


def markdown(result):
  out = comparison.page_head("The other optimizer over AdamW", result)
  out += [comparison.reading_row(f"({k})", result["factor"][k]) for k in ("a", "b")]
  out += comparison.interpolated_lines(result) + ["", comparison.verdict_line(result), ""]
  return "\\n".join(out + comparison.side_lines(result) + comparison.curve_lines(result))


STUDY = Study(header, train, record, markdown, "toy_optimizer-{preset}.json")
"""


def _stub_result(spec):
  """AdamW L = 2.5 + 0.8 (T/N)^-0.7, the other side the same at K T, each seed 0.01 apart; every eval window
  scores a run's loss +- 0.02."""
  c = spec["config"]
  steps, n = c["trainer"]["steps"], 40
  loss = 2.5 + 0.8 * ((K if c["optim"]["b1"] == 0.5 else 1.0) * steps / n) ** -0.7 + 0.01 * (c["seed"] % 100)
  return {
    "seed": c["seed"],
    "steps": steps,
    "lr": c["optim"]["learning_rate"],
    "curve": [{"step": steps, "eval_loss_raw": loss + 0.01, "eval_loss_averaged": loss}],
    "final_raw": loss + 0.01,
    "final_averaged": {str(b): loss for b in spec["betas"]},
    "final_averaged_per_batch": [loss + 0.02 * (-1) ** j for j in range(2 * c["trainer"]["eval_batches"])],
  }


def test_one_more_optimizer_against_adamw_is_a_short_declaration_on_the_blocks(tmp_path, monkeypatch):
  folder = tmp_path / "toy_optimizer"
  folder.mkdir()
  (folder / "__init__.py").write_text("")
  (folder / "config.py").write_text(textwrap.dedent(CONFIG))
  (folder / "run.py").write_text(textwrap.dedent(RUN))
  assert len((CONFIG + RUN).splitlines()) <= 150
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(study.STUDIES, "toy_optimizer", "toy_optimizer")
  runner = SpecRunner(_stub_result)
  monkeypatch.setattr(study, "make_runner", lambda config, workdir: contextlib.nullcontext(runner))
  c = benchmark_cfg.get_config("quick")
  c.benchmark.study = "toy_optimizer"
  assert c.trainer.steps == 40
  try:
    c.benchmark.toy_optimizer.tuning_seeds = (21,)
    with pytest.raises(ValueError, match=r"toy_optimizer\.tuning_seeds=\(21,\): .*nothing is tuned on a headline"):
      study.run(c, str(tmp_path / "work"))
    c.benchmark.toy_optimizer.tuning_seeds = (1001, 1002, 1003)
    result = study.run(c, str(tmp_path / "work"))
  finally:
    for name in ("toy_optimizer.run", "toy_optimizer.config", "toy_optimizer"):
      sys.modules.pop(name, None)
  # The other side at N is AdamW at K N, inside AdamW's budgets; AdamW at N is the other at N / K = 0.5 N, which
  # its curve meets (not passes) at 0.5 N: extended down to 0.25 N.
  assert result["extended"] == {"adamw": [], "other": [0.5, 0.25]}
  for reading in ("a", "b"):
    assert result["factor"][reading]["per_seed"] == pytest.approx([K, K], rel=1e-3)
  assert result["verdict"] == "above 1.0×"
  written = json.loads((tmp_path / "work" / "toy_optimizer-quick.json").read_text())
  md = (tmp_path / "work" / "toy_optimizer-quick.md").read_text()
  assert md.startswith("# The other optimizer over AdamW") and "| other | other |" in md
  assert written["sides"]["other"]["budgets"] == [0.25, 0.5, 0.75, 1.0]
