"""Every wall-clock ratio carries its spread over the interleaved timing rounds: a record keeps each
round's time per arm and step kind, the ratio is computed round by round, and the tables show the
interquartile range beside the ratio; a record from before the rounds were kept says "spread not
recorded". The times here are made up: nothing is timed."""

from __future__ import annotations

import json
import os
import statistics

import pytest
from conftest import ROOT, load_script

from hybridjax.bench import cells, record, timing
from hybridjax.bench.studies.family import figures as family_figs
from hybridjax.bench.studies.family import report as family_report
from hybridjax.bench.studies.ladder import figures as ladder_figs
from hybridjax.bench.studies.ladder import report as ladder_report
from hybridjax.bench.studies.recipe import figures as recipe_figs
from hybridjax.bench.studies.recipe import report as recipe_report

RESULTS = os.path.join(ROOT, "docs", "results")
# One factor per timing round, by which the baseline's steps of that round are slower than its median:
# the round-by-round ratio is the ratio times the factor.
LOAD = [1.0, 1.3, 0.8, 1.1, 0.95, 1.6, 0.9]


def _load(*parts):
  with open(os.path.join(RESULTS, *parts)) as f:
    return json.load(f)


def _quartiles(xs):
  q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
  return q1, q3


def _with_rounds(ms_per_step, missing=None):
  """`rounds_ms` for a timing's `ms_per_step` (arm -> kind -> ms): the baseline's kind scaled by `LOAD`
  round by round, every other arm's kinds at their median in every round; `missing` (arm, kind) not run
  in the first round."""
  out = {}
  for arm, kinds in ms_per_step.items():
    out[arm] = {}
    for kind, ms in kinds.items():
      rounds = [ms * f for f in LOAD] if arm == "baseline" else [ms] * len(LOAD)
      if (arm, kind) == missing:
        rounds[0] = None
      out[arm][kind] = rounds
  return out


def test_a_record_keeps_each_rounds_median_per_arm_and_step_kind():
  """`timing._medians`: the medians over every round (as before), the samples, and each round's own
  median per arm and kind, None for a round in which a kind did not run (a jump arm's rare CORRECT)."""
  per_round = {
    "baseline": {"baseline": [[0.010, 0.012, 0.011], [0.020, 0.022, 0.021]]},
    "jump": {"full_step": [[0.013], [0.015, 0.017]], "correct_step": [[], [0.030]]},
  }
  got = timing._medians(per_round)
  assert got["ms_per_step"]["baseline"]["baseline"] == pytest.approx(16.0)  # the median of all six, not of the rounds
  assert got["samples"] == {"baseline": {"baseline": 6}, "jump": {"full_step": 3, "correct_step": 1}}
  assert got["rounds_ms"]["baseline"]["baseline"] == pytest.approx([11.0, 21.0])
  assert got["rounds_ms"]["jump"]["full_step"] == pytest.approx([13.0, 16.0])
  assert got["rounds_ms"]["jump"]["correct_step"][0] is None
  assert got["rounds_ms"]["jump"]["correct_step"][1] == pytest.approx(30.0)


def test_a_familys_wallclock_ratio_shows_its_spread_over_the_rounds():
  """A family record with per-round times: each wall-clock ratio is the one the medians give, and beside
  it the IQR over the rounds of the ratio computed round by round (here the ratio times `LOAD`); a kind
  missing from a round reads its median there. Without them, the table says 'spread not recorded'."""
  stored = _load("long-adamw-cosine", "benchmark.json")
  before = family_figs.family_figures(stored)
  md = family_report.markdown(stored | before)
  row = next(line for line in md.splitlines() if line.startswith("| wallclock_ratio vs averaged_baseline"))
  assert row.count("; spread not recorded") == len(before["figures"]) and "IQR" not in md
  method = next(iter(stored["figures"]))
  kind = next(iter(stored["timing"]["ms_per_step"][method]))
  timed = dict(stored["timing"], rounds_ms=_with_rounds(stored["timing"]["ms_per_step"], (method, kind)))
  timed_record = dict(stored, timing=timed)
  after = family_figs.family_figures(timed_record)
  for m, f in after["figures"].items():
    for anchor in ("baseline", "averaged_baseline"):
      wall, old = f[anchor]["wallclock_ratio"], before["figures"][m][anchor]["wallclock_ratio"]
      assert wall["values"] == old["values"] and wall["mean"] == old["mean"]  # the figure itself is unchanged
      assert "spread" not in old
      q1, q3 = _quartiles([wall["mean"] * f for f in LOAD])
      assert (wall["spread"]["q1"], wall["spread"]["q3"]) == (pytest.approx(q1), pytest.approx(q3)), (m, anchor)
      assert wall["spread"]["rounds"] == len(LOAD)
  wall = after["figures"][method]["averaged_baseline"]["wallclock_ratio"]
  md = family_report.markdown(timed_record | after)
  row = next(line for line in md.splitlines() if line.startswith("| wallclock_ratio vs averaged_baseline"))
  cell = row.split(" | ")[1]
  q1, q3 = wall["spread"]["q1"], wall["spread"]["q3"]
  assert cell.startswith(f"{wall['mean']:.2f}×") and cell.endswith(
    f"; IQR over {len(LOAD)} timing rounds {q1:.2f}–{q3:.2f}×"
  )
  assert "spread not recorded" not in row
  assert after["headline"]["wallclock_ratio_spread"]["vs_averaged_baseline"] == wall["spread"]
  assert "wallclock_ratio_spread" not in before["headline"]


def test_the_ladders_wallclock_ratios_show_their_spread_and_r0s_too():
  """The ladder's rung tables and its R0 (N steps against N baseline steps, in wall-clock) carry the
  spread over the rounds where the timing kept them, and say 'spread not recorded' where it did not."""
  stored = _load("ladder", "ladder-long.json")
  config = record.stored_config(stored)
  ms = {k: v["ms_per_step"] for k, v in stored["timing"].items()}
  rounds = {k: _with_rounds(v) for k, v in ms.items()}
  rungs = ladder_figs.rung_figures(config, stored["groups"], ms, stored["steps"], rounds)
  assert (
    json.loads(json.dumps(ladder_figs.rung_figures(config, stored["groups"], ms, stored["steps"]))) == stored["rungs"]
  )
  checked = 0
  for name, rung in rungs.items():
    for m, f in rung["figures"].items():
      old = stored["rungs"][name]["figures"][m]["wallclock_ratio"]
      assert f["wallclock_ratio"]["mean"] == old["mean"] and "spread" not in old
      if f["wallclock_ratio"]["mean"] is not None:
        q1, q3 = _quartiles([f["wallclock_ratio"]["mean"] * x for x in LOAD])
        assert f["wallclock_ratio"]["spread"]["q1"] == pytest.approx(q1)
        assert f["wallclock_ratio"]["spread"]["q3"] == pytest.approx(q3)
        checked += 1
      if name == "R0":
        e = f["equal_steps"]["wallclock_ratio"]
        q1, q3 = _quartiles([e["mean"] * x for x in LOAD])
        assert (e["spread"]["q1"], e["spread"]["q3"]) == (pytest.approx(q1), pytest.approx(q3))
  assert checked and "R0" in rungs
  md = ladder_report.ladder_markdown(stored | {"rungs": rungs})
  assert "spread not recorded" not in md and f"IQR over {len(LOAD)} timing rounds" in md
  published = ladder_report.ladder_markdown(stored)
  r0 = next(line for line in published.splitlines() if line.startswith("| `long` | jump"))
  assert "(spread not recorded)" in r0.split(" | ")[2]


def test_the_recipes_wallclock_ratios_show_their_spread():
  """A recipe's per-step wall-clock ratio (speed-up × the anchor's ms over the step's) carries its spread
  over the rounds; a published recipe's says 'spread not recorded', in its table and its scale line."""
  stored = _load("recipe", "recipe-tiny.json")
  ms = stored["timing"]["ms_per_step"]
  rounds = {name: [v * f for f in LOAD] if name == "anchor" else [v] * len(LOAD) for name, v in ms.items()}
  timed_record = dict(stored, timing=dict(stored["timing"], rounds_ms=rounds))
  rows = recipe_figs.recipe_figures(timed_record)["figures"]
  for row, old in zip(rows, recipe_figs.recipe_figures(stored)["figures"]):
    assert row["wallclock_ratio"]["mean"] == old["wallclock_ratio"]["mean"] and "spread" not in old["wallclock_ratio"]
    # The anchor against itself: the same round's time on both sides, 1.00× in every round.
    factors = [1.0] * len(LOAD) if row["name"] == "anchor" else LOAD
    q1, q3 = _quartiles([row["wallclock_ratio"]["mean"] * f for f in factors])
    spread = row["wallclock_ratio"]["spread"]
    assert (spread["q1"], spread["q3"]) == (pytest.approx(q1), pytest.approx(q3)), row["name"]
  last = rows[-1]
  total = {**stored["total_speedup"], "wallclock_ratio": last["wallclock_ratio"]}
  md = recipe_report.recipe_markdown(timed_record | {"figures": rows, "total_speedup": total})
  assert cells.spread_note(last["wallclock_ratio"]) in md and "spread not recorded" not in md
  published = recipe_report.recipe_markdown(stored)
  assert f"{stored['total_speedup']['wallclock_ratio']['mean']:.2f}× in wall-clock (spread not recorded)" in published


def test_the_results_table_shows_a_headlines_spread_or_that_it_was_not_recorded():
  """docs/results/README.md's wall-clock column, from each headline.json: the IQR over the timing rounds
  where the headline has it (`wallclock_ratio_spread`), else 'spread not recorded'."""
  table = load_script("results_table")
  headline = _load("long-adamw-cosine", "headline.json")
  assert "wallclock_ratio_spread" not in headline
  assert table._wallclock(headline, "averaged_baseline").endswith("; spread not recorded")
  spread = {"q1": 1.01, "q3": 1.08, "iqr": 0.07, "rounds": 12, "per_round": []}
  headline["wallclock_ratio_spread"] = {"vs_averaged_baseline": spread}
  cell = table._wallclock(headline, "averaged_baseline")
  assert cell.startswith(f"{headline['wallclock_ratio']['vs_averaged_baseline']:.2f}×")
  assert cell.endswith("; IQR over 12 timing rounds 1.01–1.08×")
