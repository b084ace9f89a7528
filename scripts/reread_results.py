"""Re-reads every published result from the runs stored with it, with the current figures and report
(no training): each family's benchmark.json, headline.json and results.md, each ladder's and each
recipe's json, md and figure (a recipe of an earlier trick list kept beside the current one too), each
variants and knobs record's json and md. A record kept as first written (`*.as-written.json`) is not
re-read: its words stay those of the rule it names, or of `protocol.UNMARKED_RULE` (`protocol.rule_of`).

  python scripts/reread_results.py           # rewrite what the current reading changes
  python scripts/reread_results.py --check   # exit 1 naming each file the current reading would change

The figures are pure functions of the stored runs (`family_figs.family_figures`, `ladder_figs.rung_figures`,
`recipe_figs.recipe_figures`); the tests recompute them from the published files (tests/bench/studies/test_ladder.py,
tests/bench/test_reread.py). Then `python scripts/readme_tables.py --update` and
`python scripts/results_table.py --update` regenerate the tables the READMEs hold.

A published ladder or recipe that ran before its runs' eval errors were recorded gets them here, from
the per-batch losses of the same runs where they are stored (`eval` of each tuned ladder group: its
family's benchmark.json, which holds the very runs, as tests/bench/studies/test_ladder.py checks; the `tiny`
recipe's anchor: its run cache). The `long` recipe's anchor runs kept no per-batch losses: it gets
the `long-adamw-cosine` family's (the same eval batches, the same R4 anchor but for its averaging
beta), named as such in its `source`. A ladder's tuned groups get their method runs' statistics (the
jump predictor's accepted jumps, which mark an arm "not exercised") the same way, where ladder.json
kept none.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")

sys.path.insert(0, ROOT)

from hybridjax.bench import figures, record  # noqa: E402
from hybridjax.bench.studies.family import figures as family_figs  # noqa: E402
from hybridjax.bench.studies.family import report as family_report  # noqa: E402
from hybridjax.bench.studies.knobs import report as knobs_report  # noqa: E402
from hybridjax.bench.studies.knobs import run as knobs_run  # noqa: E402
from hybridjax.bench.studies.ladder import figures as ladder_figs  # noqa: E402
from hybridjax.bench.studies.ladder import report as ladder_report  # noqa: E402
from hybridjax.bench.studies.ladder import rungs as ladder_rungs  # noqa: E402
from hybridjax.bench.studies.recipe import figures as recipe_figs  # noqa: E402
from hybridjax.bench.studies.recipe import report as recipe_report  # noqa: E402
from hybridjax.bench.studies.variants import report as variants_report  # noqa: E402
from hybridjax.bench.studies.variants import run as variants_run  # noqa: E402


def _load(path: str) -> dict[str, Any]:
  with open(path) as f:
    return json.load(f)


def _text(result: dict[str, Any], indent: int) -> str:
  return json.dumps(result, indent=indent)


def stored_controls(result: dict[str, Any]) -> dict[str, str] | None:
  """arm -> the control arm its stored `vs_skip_control` was computed against, for a record whose config
  predates `benchmark.arms` (then every arm was compared with `skip_control`); None for any other."""
  if result["config"]["benchmark"].get("arms"):
    return None
  runs, out = result["method_runs"], {}
  for m, f in result["figures"].items():
    stored = (f.get("vs_skip_control") or {}).get("differences")
    if stored is None:
      continue
    seeds = sorted(runs[m], key=int)
    for c in runs:
      if c != m and [runs[m][s]["final_loss"] - runs[c][s]["final_loss"] for s in seeds] == stored:
        out[m] = c
        break
    else:
      raise SystemExit(f"{result['preset']}-{result['family']}: no stored run is {m}'s control")
  return out


def family_files(result: dict[str, Any]) -> dict[str, str]:
  """{file name: text} of a family's re-read results (the plots do not read a ratio: unchanged)."""
  result = dict(result)
  stored = result["figures"]
  result.update(family_figs.family_figures(result, stored_controls(result)))
  for m, f in result["figures"].items():
    # A record's own fields the current figures no longer make (an old record's method statistics,
    # e.g. its accepted jumps) are kept, and reported as the method's statistics.
    kept = [k for k in stored[m] if k not in f and k not in ("vs_skip_control", "method_stats")]
    result["figures"][m] = {k: f.get(k, v) for k, v in stored[m].items()} | f
    if kept and "method_stats" not in f:
      result["figures"][m]["method_stats"] = kept
  return {
    "benchmark.json": _text(result, 2),
    "headline.json": _text(result["headline"], 2),
    "results.md": family_report.markdown(result),
  }


def _family_eval(preset: str, family_name: str) -> dict[str, Any] | None:
  """The eval errors of the published family `<preset>-<family_name>`, from its stored runs."""
  path = os.path.join(RESULTS, f"{preset}-{family_name}", "benchmark.json")
  if not os.path.exists(path):
    return None
  r = _load(path)
  seeds = sorted({k.split("/")[0] for k in r["budget_runs"]}, key=int)
  return figures.eval_errors(r["budget_runs"], seeds, r["budgets"], r["steps"])


def _family_method_stats(preset: str, group: dict[str, Any]) -> None:
  """Gives each method run of a tuned ladder group that kept no method statistics (a ladder published
  before ladder.json kept them) those of the same run in its family's published benchmark.json (the
  very run: the same seed, key and final losses, as tests/bench/studies/test_ladder.py checks), e.g.
  the jump predictor's accepted jumps, which say whether an arm was exercised."""
  path = os.path.join(RESULTS, f"{preset}-{group['family']}", "benchmark.json")
  if not os.path.exists(path):
    return
  stored = _load(path)["method_runs"]
  for m, runs in group["method_runs"].items():
    for s, run in runs.items():
      same = stored.get(m, {}).get(s)
      if "method_stats" in run or same is None or not same.get("method_stats"):
        continue
      if (same["final_raw"], same["final_averaged"], same.get("key")) != (
        run["final_raw"],
        run["final_averaged"],
        run.get("key"),
      ):
        raise SystemExit(f"{preset} ladder: {m} seed {s} is not the run {path} holds")
      run.update({k: same[k] for k in same["method_stats"]}, method_stats=list(same["method_stats"]))


def ladder_result(result: dict[str, Any]) -> dict[str, Any]:
  """A ladder re-read: each tuned group given its eval errors and its method runs' statistics (from its
  family's stored runs) where it has none, every rung recomputed."""
  result = json.loads(json.dumps(result))
  for name, group in result["groups"].items():
    if name in ladder_rungs.TUNED_GROUPS and group.get("eval") is None:
      errors = _family_eval(result["preset"], group["family"])
      if errors is not None:
        group["eval"] = errors
    if name in ladder_rungs.TUNED_GROUPS:
      _family_method_stats(result["preset"], group)
  config = record.stored_config(result)  # an old record's flat study fields too
  result["rungs"] = ladder_figs.timed_rung_figures(config, result["groups"], result["timing"], result["steps"])
  return result


def _tiny_recipe_anchor_eval(result: dict[str, Any]) -> dict[str, Any] | None:
  """The `tiny` recipe's anchor eval errors, from the anchor's runs in its committed run cache (each
  found by its seed, budget, LR, beta and its loss on the anchor's curve)."""
  anchor, n = result["anchor"], result["steps"]
  cache = [_load(p) for p in glob.glob(os.path.join(RESULTS, "recipe", f"{result['preset']}-run-cache", "*.json"))]
  if not cache:
    return None
  runs = {}
  for s, curve in anchor["curves"].items():
    for steps, loss in zip(curve["steps"], curve["loss"]):
      found = [
        r
        for r in cache
        if str(r["seed"]) == s
        and r["steps"] == steps
        and r["lr"] == anchor["per_budget_lr"][str(steps / n)]
        and r["final_averaged"].get(str(float(anchor["beta"]))) == loss
      ]
      if len(found) == 1:
        runs[f"{s}/{steps}"] = found[0]
  seeds = sorted(anchor["curves"], key=int)
  return figures.eval_errors(runs, seeds, anchor["budgets"], n) if all(f"{s}/{n}" in runs for s in seeds) else None


def recipe_result(result: dict[str, Any]) -> dict[str, Any]:
  """A recipe re-read: its anchor given its eval errors where it has none, every step recomputed."""
  result = json.loads(json.dumps(result))
  if result["anchor"].get("eval") is None:
    errors = _tiny_recipe_anchor_eval(result)
    if errors is None:
      errors = _family_eval(result["preset"], "adamw-cosine")
      if errors is not None:
        errors["source"] = (
          f"from the {result['preset']}-adamw-cosine family's anchor runs (the same eval batches; this recipe's "
          "anchor runs kept no per-batch losses)"
        )
    result["anchor"]["eval"] = errors
  return result | recipe_figs.recipe_figures(result)


def variants_result(result: dict[str, Any]) -> dict[str, Any]:
  """A variants record re-read: every pair's figures from its sides' runs (`variants_run.pair_figures`),
  and the table's resolution."""
  result = json.loads(json.dumps(result))
  for p in result["pairs"]:
    p.update(
      variants_run.pair_figures(*({"settings": p["settings"][k], "runs": p["runs"][k]} for k in ("before", "after")))
    )
  result["resolution"] = variants_run.resolution(result["pairs"])
  return result


def knobs_result(result: dict[str, Any]) -> dict[str, Any]:
  """A knobs record re-read: every side's headline figures from its runs (`knobs_run.side_figures`)."""
  result = json.loads(json.dumps(result))
  for s in result["sides"].values():
    read = knobs_run.read_of(s["published_settings"], s["tuned_read"])
    s.update(knobs_run.side_figures(s["runs"]["published"], s["runs"]["tuned"], read))
  return result


def rewrites() -> list[tuple[str, str, Any]]:
  """(path, new text, the re-read result or None) of every published file the re-reading gives."""
  out = []
  for path in sorted(glob.glob(os.path.join(RESULTS, "*", "benchmark.json"))):
    folder = os.path.dirname(path)
    for name, text in family_files(_load(path)).items():
      out.append((os.path.join(folder, name), text, None))
  for kind, reread, markdown in (
    ("ladder", ladder_result, ladder_report.ladder_markdown),
    ("recipe", recipe_result, recipe_report.recipe_markdown),
  ):
    # A recipe replaced by a later trick list is kept beside it (`trick-list-<k>-recipe-<preset>`), and read alike.
    kept = glob.glob(os.path.join(RESULTS, kind, f"trick-list-*-{kind}-*.json"))
    for path in sorted(glob.glob(os.path.join(RESULTS, kind, f"{kind}-*.json")) + kept):
      result = reread(_load(path))
      out.append((path, _text(result, 1), result))
      out.append((path[: -len(".json")] + ".md", markdown(result) + "\n", None))
  for kind, reread, markdown in (
    ("variants", variants_result, variants_report.markdown),
    ("knobs", knobs_result, knobs_report.markdown),
  ):
    for path in sorted(glob.glob(os.path.join(RESULTS, "recipe", f"{kind}-*.json"))):
      if path.endswith(".as-written.json"):  # kept as the study first wrote it (scripts/reshape_variants.py)
        continue
      result = reread(_load(path))
      out.append((path, json.dumps(result, indent=1), None))
      out.append((path[: -len(".json")] + ".md", markdown(result) + "\n", None))
  return out


def _drawn(result: dict[str, Any]) -> Any:
  """What a ladder's or a recipe's figure draws."""
  if "rung_names" in result:
    return ladder_report.ladder_plot_data(result)
  return [r["speedup"]["per_seed"] for r in result["figures"]]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that would change")
  args = parser.parse_args()
  changed = []
  for path, text, result in rewrites():
    with open(path) as f:
      old = f.read()
    if old == text:
      continue
    changed.append(os.path.relpath(path, ROOT))
    if args.check:
      continue
    with open(path, "w") as f:
      f.write(text)
    if result is not None and _drawn(json.loads(old)) != _drawn(result):  # the figure draws per-seed ratios
      save = ladder_report.save_ladder_plot if "rung_names" in result else recipe_report.save_recipe_plot
      save(result, os.path.dirname(path))
  print("\n".join(changed) if changed else "every published result reads as it is published")
  if args.check and changed:
    sys.exit(1)


if __name__ == "__main__":
  main()
