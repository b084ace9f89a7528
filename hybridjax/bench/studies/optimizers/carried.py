"""The cells that carry cell `both_tuned`'s chosen settings to a new condition, each side's LR then checked
locally (docs/benchmark.md, cells `small_batch` and `corpus`): `small_batch`, the preset's N steps of B
windows as N·B/b steps of b windows on the same eval windows, every knob counted in steps moved to the same
tokens (`search.Knob.at_batch`); `corpus`, a second corpus read without repeats. `critical_batch` reads each
side's loss at N tokens against cell `both_tuned`'s."""

from __future__ import annotations

import math
import os
import statistics

from hybridjax import data as data_lib
from hybridjax.bench import comparison, search, specs, tuning
from hybridjax.bench import record as record_lib
from hybridjax.bench.comparison import loss_of, side_curves
from hybridjax.bench.runs.runner import Runner
from hybridjax.bench.speedrun import shown_path
from hybridjax.bench.studies import Config, Record, copied

FROM_CELL = "both_tuned"  # the cell whose chosen settings these cells carry


def before_record(config: Config) -> tuple[str, Record]:
  """(its path as shown, the record) of the cell `both_tuned` record the settings come from
  (`optimizers.settings_from`; '': the published one at this preset). A missing one, or one of another cell,
  preset, rows, token budget or eval windows, is refused naming the field."""
  o, preset = config.benchmark.optimizers, str(config.benchmark.preset)
  path, before = record_lib.both_tuned_record(config, "optimizers.settings_from", f"cell {FROM_CELL!r}")
  rows = {side: before["sides"][side]["settings"]["row"] for side in ("adamw", "muon")}
  if (before["cell"]["name"], before["preset"], rows) != (FROM_CELL, preset, {s: str(o[f"{s}_row"]) for s in rows}):
    raise ValueError(
      f"--config.benchmark.optimizers.settings_from={path}: a cell {before['cell']['name']!r} record at "
      f"{before['preset']!r} with rows {rows}; cell {o.cell!r} carries cell {FROM_CELL!r} at {preset!r} with "
      f"rows {o.adamw_row!r} and {o.muon_row!r}"
    )
  b, e, n = int(config.trainer.batch_size), int(config.trainer.eval_batches), int(config.trainer.steps)
  was_b, was_ctx = (int(x) for x in before["cell"]["batch"])
  same = (
    int(before["steps"]) * was_b == n * b
    and was_ctx == int(config.model.n_ctx)
    and int(before["cell"]["eval_batches"]) * was_b == e * b
  )
  if not same:
    raise ValueError(
      f"--config.benchmark.optimizers.settings_from={path}: its runs read {before['steps']} steps of "
      f"{was_b} × {was_ctx} tokens, scored on {before['cell']['eval_batches']} × {was_b} windows; this preset's "
      f"read {n} steps of {b} × {config.model.n_ctx}, scored on {e} × {b}: give the record of cell {FROM_CELL!r} "
      "at this preset's token budget and eval windows (the cells compare at equal tokens on the same windows)"
    )
  return shown_path(path), before


def smaller_batch(config: Config) -> Config:
  """Cell `small_batch`'s config: at `optimizers.batch_size` windows per step, at the same tokens (N·B/b steps,
  E·B/b eval batches)."""
  t, b = config.trainer, int(config.benchmark.optimizers.batch_size)
  scaled = {f"trainer.{k}": int(t[k]) * int(t.batch_size) // b for k in ("steps", "eval_batches")}
  return copied(config, {"trainer.batch_size": b} | scaled)


def on_corpus(config: Config) -> Config:
  """Cell `corpus`'s config: on `optimizers.corpus_path`, without repeats."""
  return copied(
    config, {"data.path": os.path.expanduser(str(config.benchmark.optimizers.corpus_path)), "data.order": "no_repeat"}
  )


def batch_errors(config: Config, largest: float, name: str) -> list[str]:
  """Cell `small_batch`: its batch against the preset's (smaller, dividing its steps' and eval batches'
  windows)."""
  del largest, name
  b, big = int(config.benchmark.optimizers.batch_size), int(config.trainer.batch_size)
  n, e = int(config.trainer.steps), int(config.trainer.eval_batches)
  if b >= big or (n * big) % b or (e * big) % b:
    return [
      f"--config.benchmark.optimizers.batch_size={b}: cell 'small_batch' needs a batch below the preset's {big} "
      f"that divides its {n * big} training windows and its {e * big} eval windows (e.g. {big // 4 or 1})"
    ]
  return []


def corpus_errors(config: Config, largest: float, name: str) -> list[str]:
  """Cell `corpus`: its corpus exists and holds the windows its largest budget (`largest` x N) reads without
  repeats; a publish over its record `name` that read another corpus by content (`corpus.content_hash`),
  though at the same `corpus_path`, is refused (the config alone cannot tell)."""
  path = os.path.expanduser(str(config.benchmark.optimizers.corpus_path))
  given = str(config.data.path)
  if given and os.path.abspath(os.path.expanduser(given)) != os.path.abspath(path):
    return [
      f"--config.data.path={given}: cell 'corpus' trains on --config.benchmark.optimizers.corpus_path ({path}), "
      "which would replace it; give the corpus there instead"
    ]
  if not data_lib.split_folders(path):
    return [
      f"--config.benchmark.optimizers.corpus_path={path}: no corpus with train/ and val/ folders there; build it "
      f"with `python scripts/build_corpus.py --out {path}` (npm's registry), or give the folder that holds it"
    ]
  c = on_corpus(config)
  try:
    prepared = data_lib.prepare_corpus(path, str(c.data.tokenizer), str(c.data.cache_dir) or None)
  except ValueError as e:  # the data block's error names data.path, which this field sets
    return [f"--config.benchmark.optimizers.corpus_path={path}: {e}"]
  steps = round(largest * int(c.trainer.steps))
  try:
    data_lib.check_no_repeat(prepared.n_train, int(c.model.n_ctx), steps, int(c.trainer.batch_size))
  except ValueError as e:
    return [f"{e} (cell 'corpus': its largest budget, {largest:g} N, with its extensions)"]
  folder = str(config.benchmark.publish)
  was = record_lib.stored(os.path.join(folder, name)).get("corpus", {}).get("content_hash") if folder else None
  if was and prepared.meta["content_hash"] != was:
    line = f"corpus.content_hash: {was[:16]} there, {prepared.meta['content_hash'][:16]} here"
    return [record_lib.publish_refusal(folder, os.path.join(folder, name), "a record of another corpus", [line])]
  return []


def converted(c: Config, fields: Record, beta: float, ratio: float) -> tuple[Record, float]:
  """(`fields` and the averaging `beta`, moved to a batch `ratio` times as large at the same tokens): each
  field by its knob in `c`'s search space (`search.Knob.at_batch`), the averaging beta as a decay per step."""
  knobs = {k.field: k for k in search.space_of(c, int(c.optim.warmup_steps))}
  out = {k: knobs[k].at_batch(v, ratio) if k in knobs else v for k, v in fields.items()}
  return out, search.Knob("beta", "choice", (), per_step="ema").at_batch(beta, ratio)


def beta2_field(c: Config) -> str:
  """The field of the side's Adam beta2 (the one knob of its space searched as 1 - the value)."""
  (field,) = [k.field for k in search.space_of(c, int(c.optim.warmup_steps)) if k.one_minus]
  return field


def converted_sides(
  config: Config, configs: dict[str, tuple[Config, dict]], before: Record
) -> dict[str, tuple[Config, dict]]:
  """Each side's config and settings: cell `both_tuned`'s chosen fields, beta and iterate (in `before`),
  converted to this cell's batch; its settings keep `before`'s under 'from' and the beta2 before the
  conversion under 'beta2_unconverted'."""
  ratio = int(config.trainer.batch_size) / int(before["cell"]["batch"][0])
  out = {}
  for side, (c, published) in configs.items():
    was = before["sides"][side]["settings"]
    fields, beta = converted(c, was["fields"], float(was["beta"]), ratio)
    tuned = search.apply_setting(c, fields)
    b2 = beta2_field(c)
    settings = {"row": published["row"], "lr": float(fields["optim.learning_rate"]), "beta": beta}
    settings |= {"iterate": was["iterate"], "weight_decay": search.weight_decay_of(tuned)[1], "fields": fields}
    out[side] = (tuned, settings | {"from": was, "beta2_unconverted": was["fields"][b2]})
  return out


def local_candidates(c: Config, settings: Record) -> list[Record]:
  """The local check's settings, the converted one first: the LR at its sqrt(2) neighbours × beta2
  {converted, unconverted}."""
  lr, b2 = float(settings["lr"]), beta2_field(c)
  lrs = [lr] + [tuning.round_lr(lr * math.sqrt(2) ** k) for k in (-1, 1)]
  b2s = list(dict.fromkeys([settings["fields"][b2], settings["beta2_unconverted"]]))
  return [{"optim.learning_rate": x, b2: y} for y in b2s for x in lrs]


# How often the local check may move its LR on past a winning edge neighbour (the joint search's limit):
# four sqrt(2) steps reach the linear scaling rule's LR at a quarter of the batch (the square-root rule's
# needs two).
LR_MOVES = search.LR_MOVES


def _best(tried: list[Record]) -> Record:
  """The setting of the lowest mean loss tried (the first, the converted one, on a tie)."""
  return min(tried, key=lambda t: statistics.fmean(t["losses"]))


def _next_lr(tried: list[Record], b2: str) -> float | None:
  """The LR one sqrt(2) step past the best setting's, where that setting is the lowest or highest LR tried
  at its beta2 (None: its LR lies inside those tried)."""
  best = _best(tried)
  edge = lr_edge({"tried": tried, "chosen": best["fields"]})
  if not edge or sum(t["fields"][b2] == best["fields"][b2] for t in tried) < 2:
    return None
  return tuning.round_lr(best["fields"]["optim.learning_rate"] * math.sqrt(2) ** (1 if edge == "high" else -1))


def local_check(
  config: Config, sides: dict[str, tuple[Config, dict]], runner: Runner
) -> tuple[dict[str, tuple[Config, dict]], dict[str, Record]]:
  """Every side's local check, each round in one batch: (the sides at their chosen setting, {side: {"tried":
  [...], "chosen", "search_runs" (N-run equivalents: the runs' steps over N)}}). Where the best setting's LR
  is the lowest or highest tried at its beta2, that LR one sqrt(2) step further is tried too, at most
  `LR_MOVES` times, both sides alike."""
  n, seeds = int(config.trainer.steps), specs.ints(config.benchmark.optimizers.tuning_seeds)
  checks: dict[str, Record] = {side: {"tried": [], "lr_moves": 0} for side in sides}
  todo = [(side, at) for side, (c, settings) in sides.items() for at in local_candidates(c, settings)]
  while todo:
    run_specs = [
      specs.run_spec(tried, kind="anchor", seed=s, lr=float(at["optim.learning_rate"]), steps=n, beta=b, betas=[b])
      for side, at in todo
      for tried, b in [(search.apply_setting(sides[side][0], at), float(sides[side][1]["beta"]))]
      for s in seeds
    ]
    results = iter(runner.run(run_specs, "optimizers: the carried settings' local check (tuning seeds)"))
    for side, at in todo:
      checks[side]["tried"].append({"fields": at, "losses": [loss_of(next(results), sides[side][1]) for _ in seeds]})
    todo = []
    for side, (c, _) in sides.items():
      b2, check = beta2_field(c), checks[side]
      lr = _next_lr(check["tried"], b2) if check["lr_moves"] < LR_MOVES else None
      if lr is not None:
        check["lr_moves"] += 1
        todo.append((side, {"optim.learning_rate": lr, b2: _best(check["tried"])["fields"][b2]}))
  out = {}
  for side, (c, settings) in sides.items():
    check = checks[side]
    best = _best(check["tried"])
    check["chosen"], check["lr_moves_limit"] = best["fields"], LR_MOVES
    check["search_runs"] = float(len(check["tried"]) * len(seeds))  # every run is N steps
    out[side] = (
      search.apply_setting(c, best["fields"]),
      settings | {"fields": settings["fields"] | best["fields"], "lr": float(best["fields"]["optim.learning_rate"])},
    )
  return out, checks


def critical_batch(result: Record, before: Record) -> Record:
  """Per side, its loss at N tokens minus cell `both_tuned`'s (in `before`), per shared headline seed, judged
  by `protocol.paired_difference` with the eval windows' error over the same window groups; and what it
  says: the larger batch above this model's critical batch where the smaller one is lower."""
  out = {}
  for side in ("adamw", "muon"):
    now, was = side_curves(result, side), side_curves(before, side)
    seeds = [s for s in now if s in was]
    if len(seeds) < 2:
      raise ValueError(
        f"the critical batch pairs the headline seeds both cells ran, and cell {FROM_CELL!r}'s record shares "
        f"{seeds or 'none'} with this cell's {list(now)}: give --config.benchmark.optimizers.seeds from its seeds "
        f"{list(was)}, or its record with those seeds (--config.benchmark.optimizers.settings_from)"
      )
    d = comparison.at_n(result, before, side, seeds)
    word = {"lower": "above", "higher": "below"}.get(d["verdict"])
    d["reading"] = (
      f"{before['cell']['batch'][0]} windows per step are {word} this model's critical batch for {side}"
      if word
      else f"no difference at equal tokens: the critical batch for {side} is not located"
    )
    out[side] = d | {"seeds": seeds}
  return out


def lr_edge(check: Record) -> str:
  """'low' or 'high' where the local check's chosen LR is the lowest or highest it tried at the chosen beta2
  ('' inside them)."""
  chosen = check["chosen"]
  lrs = [
    t["fields"]["optim.learning_rate"]
    for t in check["tried"]
    if all(t["fields"][k] == v for k, v in chosen.items() if k != "optim.learning_rate")
  ]
  lr = chosen["optim.learning_rate"]
  return "low" if lr == min(lrs) else "high" if lr == max(lrs) else ""


def local_check_lines(result: Record) -> list[str]:
  """The carried cells: what each side's settings became (cell `small_batch`: converted from cell
  `both_tuned`'s to its batch), what the local check chose, and at the smaller batch where the larger one
  sits against the critical batch."""
  checked = {side: rec for side, rec in result["sides"].items() if rec.get("local_check")}
  if not checked:
    return []
  small = result["cell"].get("eval_groups", result["cell"]["eval_batches"]) != result["cell"]["eval_batches"]
  how = (
    f"converted to {result['cell']['batch'][0]} windows per step at the same tokens (a decay per step d to "
    "d^(b/B), the warm-up's steps B/b times as many), then each side's LR at its sqrt(2) neighbours × beta2 "
    "{converted, unconverted}"
    if small
    else "unconverted, then each side's LR at its sqrt(2) neighbours"
  )

  def moves(k: int) -> str:
    return {0: "never", 1: "once", 2: "twice", 3: "three times", 4: "four times"}.get(k, f"{k} times")

  limit = list(
    {rec["local_check"]["lr_moves_limit"] for rec in checked.values() if "lr_moves_limit" in rec["local_check"]}
  )
  out = [
    "",
    f"Settings from {result['lrs_from']}, {how}, on the tuning seeds at N (the LR moved on by sqrt(2) steps while "
    "the best sat at the edge of those tried"
    + (f", at most {moves(limit[0])}" if len(limit) == 1 else "")
    + ": "
    + ", ".join(f"{side} {moves(rec['local_check']['lr_moves'])}" for side, rec in checked.items())
    + "):",
    "",
    "| side | local check runs (N-run eq.) | carried | chosen |",
    "|---|---|---|---|",
  ]
  for side, rec in checked.items():
    was = rec["settings"]["from"]
    moved = {k: f"{was['fields'][k]} → {v}" for k, v in rec["settings"]["fields"].items() if was["fields"][k] != v}
    if was["beta"] != rec["settings"]["beta"]:
      moved["beta"] = f"{was['beta']} → {rec['settings']['beta']}"
    carried = ", ".join(f"{k}: {v}" for k, v in moved.items()) or "as cell `both_tuned` chose"
    chosen = ", ".join(f"{k} = {v}" for k, v in rec["local_check"]["chosen"].items())
    out.append(f"| {side} | {rec['tuning_runs']:.1f} | {carried} | {chosen} |")
  for side, rec in checked.items():
    edge = lr_edge(rec["local_check"])
    if edge:
      out.append(
        f"\n{side}'s chosen LR is the {edge}est it tried, after the moves the check allows: a {edge}er LR may "
        f"do better: {side} may be under-tuned here, which would read the factor "
        + ("low" if side == "muon" else "high")
        + "."
      )
  if "critical_batch" in result:
    out += ["", "| side | loss at N tokens, this batch − cell `both_tuned`'s (paired seeds) | p | reading |"]
    out += ["|---|---|---|---|"]
    for side, d in result["critical_batch"].items():
      out.append(
        f"| {side} | {d['mean']:+.4f} ± {d['se_total']:.4f} se ({d['n']} seeds): {d['verdict']} | {d['p']:.3g} | "
        f"{d['reading']} |"
      )
  return out
