"""The verdict rule every study's words come from (`protocol.verdict`): paired over seeds, the seeds' and
the eval windows' standard errors together, Student's t at Satterthwaite's df; and the record of every
published verdict's switch to it from the 2 se rule (scripts/reread_verdicts.py,
docs/results/verdicts-reread.{json,md})."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import scipy.stats
from conftest import ROOT, load_script

from hybridjax.bench import protocol, stats


def test_without_an_eval_error_the_rule_is_the_paired_t_test():
  d = np.array([-1.0, -2.0, -3.0, -4.0, -5.0])
  out = protocol.paired_difference(d, np.zeros(5), rule="t")
  assert out["df"] == pytest.approx(4) and out["t_crit"] == pytest.approx(2.776445, abs=1e-6)
  assert out["p"] == pytest.approx(0.013236, abs=1e-6)  # t = -4.2426 on 4 df
  assert out["verdict"] == "lower" and out["rule"] == "t"
  assert protocol.paired_difference(-d, np.zeros(5), rule="t")["verdict"] == "higher"


def test_the_eval_error_adds_its_variance_and_satterthwaite_gives_the_df():
  d = [0.010, 0.016, 0.013, 0.019]
  se_seed = float(np.std(d, ddof=1) / 2)
  out = protocol.paired_difference(d, [0.0] * 4, eval_se=0.003, rule="t", eval_windows=48)
  total = math.hypot(se_seed, 0.003)
  df = total**4 / (se_seed**4 / 3 + 0.003**4 / 47)
  assert out["se_total"] == pytest.approx(total) and out["df"] == pytest.approx(df)
  assert out["p"] == pytest.approx(2 * scipy.stats.t.sf(np.mean(d) / total, df))
  assert out["verdict"] == ("higher" if np.mean(d) > scipy.stats.t.ppf(0.975, df) * total else "no difference")


def test_a_mean_at_the_critical_value_reads_no_difference_and_beyond_it_a_direction():
  t3 = scipy.stats.t.ppf(0.975, 2)
  assert protocol.verdict(-t3 * 0.01, 0.01, 3)["verdict"] == "no difference"
  assert protocol.verdict(-t3 * 0.01 * 1.001, 0.01, 3)["verdict"] == "lower"


def test_three_seeds_at_two_and_a_half_standard_errors_read_lower_under_2se_only():
  # Where the two rules part: t(0.975, 2) = 4.30, not 2.
  assert protocol.verdict(-0.025, 0.01, 3, rule="2se") == {"verdict": "lower"}
  new = protocol.verdict(-0.025, 0.01, 3)
  assert new["verdict"] == "no difference" and 0.05 < new["p"] < 0.2


def test_a_tiny_error_keeps_its_degrees_of_freedom():
  # se^4 of 1e-92 underflows; the df is still the seeds' n - 1, not infinite.
  assert stats.satterthwaite_df([(1e-92, 2), (0.0, math.inf)]) == pytest.approx(2)
  out = protocol.paired_difference([0.0, 0.0, 0.0], [0.0, 3.4e-92, 3.4e-92])
  assert out["df"] == pytest.approx(2) and out["verdict"] == "no difference"


def test_no_spread_reads_no_difference_only_for_a_zero_mean():
  assert protocol.verdict(0.0, 0.0, 3) == {"verdict": "no difference", "df": None, "t_crit": None, "p": 1.0}
  assert protocol.verdict(1e-7, 0.0, 3)["verdict"] == "higher"


def test_every_difference_names_its_rule_and_a_bad_rule_is_refused():
  out = protocol.paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], eval_se=0.5, eval_windows=48)
  assert out["rule"] == protocol.RULE == "t" and out["eval_windows"] == 48 and {"df", "t_crit", "p"} <= set(out)
  old = protocol.paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], eval_se=0.5, rule="2se")
  assert old["rule"] == "2se" and "p" not in old
  # A stored difference that names no rule was judged by the 2 se rule (every record before "t").
  assert protocol.rule_of({"verdict": "lower"}) == protocol.UNMARKED_RULE == "2se"
  assert protocol.rule_of(out) == "t"
  with pytest.raises(ValueError, match="verdict rule 'z'"):
    protocol.paired_difference([1.0, 2.0], [0.0, 0.0], rule="z")
  with pytest.raises(ValueError, match="se_eval must be"):
    protocol.verdict(0.1, 0.1, 3, se_eval=-1.0)


def test_the_seed_averaged_window_error_cancels_what_the_windows_share():
  rng = np.random.default_rng(0)
  difficulty = rng.normal(0, 0.1, 48)  # common to every run: cancels in a paired difference
  a = 1.7 + difficulty + rng.normal(0, 0.01, (3, 48))
  b = 1.8 + difficulty + rng.normal(0, 0.01, (3, 48))
  se = protocol.seed_averaged_window_se(a, b)
  d = (a - b).mean(0)
  assert se == pytest.approx(np.std(d, ddof=1) / math.sqrt(48))
  assert 0.5 * 0.01 * math.sqrt(2 / 3 / 48) < se < 2 * 0.01 * math.sqrt(2 / 3 / 48)
  with pytest.raises(ValueError, match="one shape"):
    protocol.seed_averaged_window_se(a, b[:2])


def _published() -> tuple[dict, str]:
  with open(os.path.join(ROOT, "docs", "results", "verdicts-reread.json")) as f:
    stored = json.load(f)
  with open(os.path.join(ROOT, "docs", "results", "verdicts-reread.md")) as f:
    md = f.read()
  return stored, md


def test_the_reread_table_records_each_verdicts_switch_and_agrees_with_the_records():
  """The table's old word is what the 2 se rule gives from its figures, its new word (with p and df) is
  what each record now publishes at its place, recomputed by the studies' code (`disagreements`)."""
  script = load_script("reread_verdicts")
  stored, md = _published()
  assert script.disagreements(stored) == []
  assert md == script.markdown(stored)
  rows = [r for f in stored["files"].values() for r in f]
  assert len(rows) >= 500 and all(r["old"] == r["old_recomputed"] for r in rows)
  flips = [r for r in rows if r["old"] != r["new"]]
  assert stored["flips"] == len(flips) and f"{len(flips)} of {len(rows)}" in md
  for r in flips:
    assert f"| {r['where']} | {r['old']} | **{r['new']}** |" in md
  lost = sum(r["new"] == "no difference" for r in flips)
  with open(os.path.join(ROOT, "docs", "results", "README.md")) as f:
    readme = " ".join(f.read().split())
  assert (
    f"{len(flips)} of the {len(rows)} verdicts read otherwise under it, {lost} losing their direction and "
    f"{len(flips) - lost} gaining one" in readme
  )
  # The check can fail: a row whose word the record does not hold is named.
  path = "docs/results/recipe/recipe-long.json"
  broken = json.loads(json.dumps(stored))
  row = next(r for r in broken["files"][path] if r["where"] == "figures.schedule.vs_previous")
  row["new"] = "lower"
  assert [x for x in script.disagreements(broken) if "figures.schedule.vs_previous" in x]


def test_where_both_sides_kept_their_windows_the_t_rule_reads_the_seed_averaged_window_error():
  stored, _ = _published()
  rows = {r["where"]: r for r in stored["files"]["docs/results/recipe/recipe-long.json"]}
  with open(os.path.join(ROOT, "docs", "results", "recipe", "recipe-long.json")) as f:
    recipe = json.load(f)
  muon, rotary = recipe["step_runs"]["muon"]["runs"], recipe["step_runs"]["rotary"]["runs"]
  seeds = sorted(muon, key=int)
  se = protocol.seed_averaged_window_se(
    [muon[s]["final_averaged_per_batch"] for s in seeds], [rotary[s]["final_averaged_per_batch"] for s in seeds]
  )
  row = rows["figures.muon.vs_previous"]
  assert row["se_eval_from"] == "windows" and row["se_eval"] == pytest.approx(se)
  assert row["se_eval_published"] == recipe["anchor"]["eval"]["paired_se"]
  published = {f["name"]: f for f in recipe["figures"]}
  assert published["muon"]["vs_previous"]["eval_se"] == pytest.approx(se)  # the study judges with it too
  assert published["muon"]["vs_previous"]["eval_windows"] == len(muon[seeds[0]]["final_averaged_per_batch"])
  # The first step's previous is the anchor, whose runs this record keeps no windows of.
  assert rows["figures.schedule.vs_previous"]["se_eval_from"] == "record"
  assert published["schedule"]["vs_previous"]["eval_se"] == recipe["anchor"]["eval"]["paired_se"]


def test_the_docs_critical_value_at_three_seeds_is_t_at_two_df():
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = " ".join(f.read().split())
  assert f"With 3 seeds its critical value is near {scipy.stats.t.ppf(0.975, 2):.1f}, not 2" in page


def test_the_docs_example_verdict_line_is_the_published_one():
  """docs/benchmark.md's example verdict line (`long`, AdamW-cosine, `jump`) is the published report's."""
  with open(os.path.join(ROOT, "docs", "benchmark.md")) as f:
    page = " ".join(f.read().split())
  example = page.split('E.g. (`long`, AdamW-cosine): "')[1].split('". An arm whose')[0]
  with open(os.path.join(ROOT, "docs", "results", "long-adamw-cosine", "results.md")) as f:
    lines = f.read().splitlines()
  assert f"* {example}" in lines and ", p " in example


def test_a_difference_is_judged_with_its_own_windows_where_both_sides_kept_them():
  """`figures.window_error`: the seed-averaged windows' error where every run kept its windows and they give
  the differences compared; None where they give other losses. `tuning.paired_eval_error` falls back to
  the runs' paired per-batch error, and judges a side read raw on the seeds alone."""
  from hybridjax.bench import figures, tuning

  rng = np.random.default_rng(1)
  a = [{"final_averaged_per_batch": list(1.7 + rng.normal(0, 0.01, 8))} for _ in range(3)]
  b = [{"final_averaged_per_batch": list(1.8 + rng.normal(0, 0.01, 8))} for _ in range(3)]
  d = [float(np.mean(x["final_averaged_per_batch"]) - np.mean(y["final_averaged_per_batch"])) for x, y in zip(a, b)]
  se, windows = figures.window_error(a, b, d)
  assert windows == 8 and se == pytest.approx(
    protocol.seed_averaged_window_se(
      [x["final_averaged_per_batch"] for x in a], [y["final_averaged_per_batch"] for y in b]
    )
  )
  assert tuning.paired_eval_error(a, b, d) == (se, 8)
  other = [x + 0.01 for x in d]  # the losses compared are not these windows' (another beta)
  assert figures.window_error(a, b, other) is None
  mean_se = np.mean([tuning.paired_batch_se_of(x, y) for x, y in zip(a, b)])
  assert tuning.paired_eval_error(a, b, other) == (pytest.approx(mean_se), 8)
  assert tuning.paired_eval_error(a, b, d, averaged=False) == (None, None)
