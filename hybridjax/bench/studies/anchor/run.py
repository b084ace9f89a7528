"""The anchor study: R4 (the recipe's tuned, averaged AdamW at `benchmark.preset`) re-checked where its
tuning never looked. Every setting of Adam's beta2 (`b2s`) x the weight decay (`weight_decays`) x the LR at
R4's and `lr_steps` sqrt(2) steps each side runs N steps on every tuning seed (`seeds`), read at R4's
averaged iterate and beta. The best setting by mean is judged against R4's own under the protocol's rule
(`protocol.paired_difference`, paired by seed, with the eval windows' error of the seed-averaged
difference). "lower" says R4 is beatable on these knobs: the recipe's headline, read on R4's curve, would
then need R4's curve re-built at that setting (each budget re-checked) and its ratios re-read; "no
difference" or the published setting best keeps R4 as published.
"""

from __future__ import annotations

import math
import statistics

from hybridjax.bench import comparison, protocol, specs, tuning
from hybridjax.bench import figures as figures_lib
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.studies import FINALS, Config, Record, Study, copied, kept
from hybridjax.bench.studies.anchor import config as anchor_config


def header(config: Config, workdir: str) -> list[str]:
  a = config.benchmark.anchor
  return [
    f"anchor {config.benchmark.preset}: R4 at beta2 {tuple(a.b2s)} x weight decay {tuple(a.weight_decays)} x its LR "
    f"+-{int(a.lr_steps)} sqrt(2) steps, N={int(config.trainer.steps)}, seeds {tuple(a.seeds)}; workdir {workdir}"
  ]


def settings_of(config: Config, r4: dict[str, float]) -> list[dict[str, float]]:
  """Every setting tried, R4's own first (kept on a tie)."""
  a = config.benchmark.anchor
  steps = sorted(range(-int(a.lr_steps), int(a.lr_steps) + 1), key=abs)
  out = [
    {"b2": float(b2), "weight_decay": float(wd), "lr": tuning.round_lr(r4["lr"] * math.sqrt(2) ** k)}
    for b2 in a.b2s
    for wd in a.weight_decays
    for k in steps
  ]
  own = {"b2": r4["b2"], "weight_decay": r4["weight_decay"], "lr": tuning.round_lr(r4["lr"])}
  return [own] + [s for s in out if s != own]


def train(config: Config, runner: Runner) -> Record:
  """Every setting on every seed, in one batch."""
  source, r4 = anchor_config.r4_settings(config)
  seeds, n = specs.ints(config.benchmark.anchor.seeds), int(config.trainer.steps)
  settings = settings_of(config, r4)
  run_specs = [
    specs.run_spec(c, kind="anchor", seed=seed, lr=s["lr"], steps=n, beta=r4["beta"], betas=[r4["beta"]])
    for s in settings
    for c in [copied(config, {"optim.b2": s["b2"], "optim.weight_decay": s["weight_decay"], "benchmark.methods": ""})]
    for seed in seeds
  ]
  results = iter(runner.run(run_specs, "anchor: R4's settings (tuning seeds)"))
  tried = [s | {"runs": [kept(next(results), ("seed", "steps", "lr", *FINALS)) for _ in seeds]} for s in settings]
  return {"source": source, "r4": r4, "seeds": seeds, "tried": tried}


def figures(result: Record) -> Record:
  """{"losses": each setting's losses per seed (averaged, at R4's beta), "best": the index of the best mean
  (R4's own, index 0, on a tie), "difference": best - R4's own (`protocol.paired_difference`), "verdict":
  its word, or "R4's own setting is the best" where it is}; a pure function of the record."""
  beta = float(result["r4"]["beta"])
  losses = [[tuning.iterate_loss(r, "averaged", beta) for r in s["runs"]] for s in result["tried"]]
  best = min(range(len(losses)), key=lambda k: statistics.fmean(losses[k]))
  if best == 0:
    return {"losses": losses, "best": 0, "difference": None, "verdict": "R4's own setting is the best"}
  differences = [x - y for x, y in zip(losses[best], losses[0])]
  error = figures_lib.window_error(result["tried"][best]["runs"], result["tried"][0]["runs"], differences)
  eval_se, windows = error if error else (None, None)
  d = protocol.paired_difference(losses[best], losses[0], eval_se, eval_windows=windows)
  return {"losses": losses, "best": best, "difference": d, "verdict": d["verdict"]}


def record(config: Config, trained: Record, timed: Record, command: str, runner: Runner) -> Record:
  del timed, command, runner
  result = {
    **comparison.code_record(config),
    "steps": int(config.trainer.steps),
    "lrs_from": trained["source"],
    "r4": trained["r4"],
    "seeds": trained["seeds"],
    "tried": trained["tried"],
    "tuning_runs": len(trained["tried"]) * len(trained["seeds"]),
  }
  return result | {"figures": figures(result)}


def markdown(result: Record) -> str:
  """anchor-<preset>.md: every setting's mean loss, the best against R4's own, and what it means."""
  r4, f = result["r4"], result["figures"]
  out = comparison.page_head(f"R4 re-checked: beta2 × weight decay × LR, `{result['preset']}`", result) + [
    f"R4 as published ({result['lrs_from']}): LR {r4['lr']:g}, beta2 {r4['b2']:g}, weight decay "
    f"{r4['weight_decay']:g}, read at its averaged iterate (beta {r4['beta']:g}). Every setting ran N = "
    f"{result['steps']} steps on the tuning seeds {result['seeds']} ({result['tuning_runs']} runs).",
    "",
    "| beta2 | weight decay | LR | loss per seed | mean | median |",
    "|---|---|---|---|---|---|",
  ]
  for k, (s, losses) in enumerate(zip(result["tried"], f["losses"])):
    mark = " (R4)" if k == 0 else (" (best)" if k == f["best"] else "")
    out.append(
      f"| {s['b2']:g} | {s['weight_decay']:g} | {s['lr']:g}{mark} | {', '.join(f'{x:.4f}' for x in losses)} | "
      f"{statistics.fmean(losses):.4f} | {statistics.median(losses):.4f} |"
    )
  d = f["difference"]
  by_median = min(range(len(f["losses"])), key=lambda k: statistics.median(f["losses"][k]))
  median_line = (
    "It is the best by median too (a run that stalls on one seed does not decide it)."
    if by_median == f["best"]
    else f"By median the best is another setting (row {by_median + 1}): single runs swing with the seed."
  )
  if d is None:
    out += ["", f"R4's own setting is the best by mean: R4 stands as published. {median_line}"]
  else:
    best = result["tried"][f["best"]]
    out += [
      "",
      f"The best, beta2 {best['b2']:g}, weight decay {best['weight_decay']:g}, LR {best['lr']:g}, against R4's own: "
      f"{d['mean']:+.4f} ± {d['se_total']:.4f} se ({d['n']} seeds, p {d['p']:.2g}): **{d['verdict']}**. " + median_line,
      "",
      "A lower loss says R4 is beatable on these knobs: the recipe's ratios, read on R4's curve, would need that "
      "curve re-built at the new setting (every budget re-checked) before they are re-read."
      if d["verdict"] == "lower"
      else "Within the noise of R4's own (or above it): R4 stands as published.",
    ]
  return "\n".join(out)


STUDY = Study(header, train, record, markdown, anchor_config.RECORD)
