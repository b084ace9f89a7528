"""One training step of the GPT-2 side by side: hybridjax's, PyTorch eager's and torch.compile's.

  python scripts/bench_step.py                          # the `tiny` model, 2 threads, 40 steps
  python scripts/bench_step.py --model=long --threads=1 # the benchmark's `long` model in one thread
  python scripts/bench_step.py --model=tiny --batch=32 --ctx=64

The same model shape, batch, optimizer and threads on both sides: the project's default AdamW (β2
0.95, weight decay 0.1 on matrices only, global-norm clipping at 1.0), fp32, a fresh batch every
step. The jax step is the baseline driver's (`loop.baseline.make_train_step`: `optim.train_step`,
jitted, donated); the PyTorch side is Hugging Face's `GPT2LMHeadModel` (GELU tanh, tied head, no
dropout) with `torch.optim.AdamW` and `clip_grad_norm_`. Each kind is timed step by step (median),
in rounds that interleave the sides, so a change in the machine's load hits them alike. Reported:
the forward pass alone, the whole step, backward+update (= step - forward), and the ratios.

PyTorch and transformers are an optional extra: `pip install -e '.[compare]'`. Without them only the
jax side is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

PRESET_SHAPES = {  # (layers, d_model, heads, ctx, batch); 'long' is the benchmark's long preset
  "tiny": (2, 128, 4, 128, 16),
  "long": (2, 64, 4, 64, 12),
  "small": (4, 256, 4, 256, 32),
  "micro": (1, 32, 2, 32, 4),
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="tiny", choices=sorted(PRESET_SHAPES))
  p.add_argument("--layers", type=int)
  p.add_argument("--d_model", type=int)
  p.add_argument("--heads", type=int)
  p.add_argument("--ctx", type=int)
  p.add_argument("--batch", type=int)
  p.add_argument("--vocab", type=int, default=256, help="256: the byte vocabulary")
  p.add_argument("--threads", type=int, default=2, help="cores and threads for both sides")
  p.add_argument("--steps", type=int, default=40, help="timed steps of each kind")
  p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the steps are split into")
  p.add_argument("--no_torch", action="store_true", help="time the jax side only")
  p.add_argument("--no_compile", action="store_true", help="skip torch.compile")
  p.add_argument("--json", default="", help="also write the figures to this file")
  p.add_argument("--table", nargs="*", help="print saved runs (--json files) as a markdown table, and exit")
  return p.parse_args(argv)


def shape(args) -> dict[str, int]:
  layers, d, heads, ctx, batch = PRESET_SHAPES[args.model]
  return dict(
    layers=args.layers or layers,
    d_model=args.d_model or d,
    heads=args.heads or heads,
    ctx=args.ctx or ctx,
    batch=args.batch or batch,
    vocab=args.vocab,
  )


def set_threads(threads: int) -> None:
  """`threads` cores for this process, and XLA told so before jax starts (one thread: no Eigen pool)."""
  if hasattr(os, "sched_setaffinity"):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores[:threads]))
  flags = os.environ.get("XLA_FLAGS", "")
  if threads == 1 and "--xla_cpu_multi_thread_eigen" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()


def batches(s: dict[str, int], n: int, seed: int = 0):
  """`n` fresh (inputs, targets) batches of random byte tokens (timing does not depend on the values)."""
  import numpy as np

  rng = np.random.default_rng(seed)
  toks = rng.integers(0, s["vocab"], size=(n, s["batch"], s["ctx"] + 1), dtype=np.int32)
  return [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in toks]


def jax_side(s: dict[str, int], n: int):
  """(forward(batch), step(batch)) of hybridjax, each blocking until done."""
  import jax

  from hybridjax import config as config_lib
  from hybridjax import optim
  from hybridjax.loop import baseline
  from hybridjax.models import gpt2

  cfg = gpt2.GPT2Config(
    vocab_size=s["vocab"], n_ctx=s["ctx"], n_layer=s["layers"], n_head=s["heads"], d_model=s["d_model"]
  )
  model = gpt2.GPT2(cfg)
  loss_fn = gpt2.make_loss_fn(model)
  oc = config_lib.default_optim_config()
  tx = optim.make_optimizer(oc)
  params = model.init(jax.random.PRNGKey(0), jax.numpy.zeros((1, s["ctx"]), jax.numpy.int32))["params"]
  holder = {"state": optim.init_train_state(params, tx)}
  step_fn = baseline.make_train_step(loss_fn, tx)
  schedule = optim.make_schedule(oc, 10_000)
  forward_fn = jax.jit(lambda p, b: loss_fn(p, b)[0])

  def forward(batch):
    jax.block_until_ready(forward_fn(holder["state"].params, batch))

  def step(batch):
    holder["state"], _ = step_fn(holder["state"], batch, schedule)
    jax.block_until_ready(holder["state"])

  return forward, step, gpt2.count_params(params)


def torch_side(s: dict[str, int], threads: int, compiled: bool):
  """(forward(batch), step(batch)) of Hugging Face's GPT-2 with the mirrored AdamW."""
  import torch
  from transformers import GPT2Config, GPT2LMHeadModel

  torch.manual_seed(0)
  torch.set_num_threads(threads)
  cfg = GPT2Config(
    vocab_size=s["vocab"],
    n_positions=s["ctx"],
    n_embd=s["d_model"],
    n_layer=s["layers"],
    n_head=s["heads"],
    activation_function="gelu_new",
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=None,
  )
  model = GPT2LMHeadModel(cfg)
  model.train()
  decay = [p for p in model.parameters() if p.ndim >= 2]
  rest = [p for p in model.parameters() if p.ndim < 2]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
    lr=1e-3,
    betas=(0.9, 0.95),
    eps=1e-8,
  )
  loss_of = torch.nn.CrossEntropyLoss()

  def loss(inputs, targets):
    logits = model(inputs).logits
    return loss_of(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

  run_loss = torch.compile(loss) if compiled else loss

  def as_torch(batch):
    return torch.from_numpy(batch["inputs"]).long(), torch.from_numpy(batch["targets"]).long()

  def forward(batch):
    with torch.no_grad():
      run_loss(*as_torch(batch))

  def step(batch):
    opt.zero_grad(set_to_none=True)
    run_loss(*as_torch(batch)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  return forward, step


def markdown_table(paths: list[str]) -> str:
  """A markdown table of saved runs (`--json` files): each side's forward, step and backward+update
  ms, and the step ratios."""
  lines = [
    "| run | shape | threads | side | forward ms | step ms | bwd+upd ms | bwd+upd / fwd | step / torch eager |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for path in paths:
    with open(path) as f:
      r = json.load(f)
    s = r["shape"]
    shape_text = f"{s['layers']}L d{s['d_model']} ctx{s['ctx']} b{s['batch']}"
    eager = r["rows"].get("torch eager", {}).get("step_ms")
    for side, row in r["rows"].items():
      ratio = f"{row['step_ms'] / eager:.2f}x" if eager else ""
      lines.append(
        f"| {os.path.splitext(os.path.basename(path))[0]} | {shape_text} | {r['threads']} | {side} | "
        f"{row['forward_ms']:.2f} | {row['step_ms']:.2f} | {row['backward_update_ms']:.2f} | "
        f"{row['bwd_over_fwd']:.2f} | {ratio} |"
      )
  return "\n".join(lines)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.table:
    print(markdown_table(args.table))
    return {}
  set_threads(args.threads)
  s = shape(args)
  sides = {}
  forward, step, n_params = jax_side(s, args.steps)
  sides["hybridjax"] = (forward, step)
  if not args.no_torch:
    try:
      import torch  # noqa: F401
      import transformers  # noqa: F401
    except ImportError:
      print(
        "PyTorch and transformers are not installed: timing the jax side only. For the comparison: "
        "pip install -e '.[compare]'",
        file=sys.stderr,
      )
    else:
      sides["torch eager"] = torch_side(s, args.threads, compiled=False)
      if not args.no_compile:
        sides["torch.compile"] = torch_side(s, args.threads, compiled=True)
  warm = batches(s, 3, seed=1)
  for forward, step in sides.values():  # compile and warm every program first (not timed)
    for b in warm:
      forward(b)
      step(b)
  per_round = max(1, args.steps // args.rounds)
  data = batches(s, per_round * args.rounds)
  times = {name: {"forward": [], "step": []} for name in sides}
  for r in range(args.rounds):
    chunk = data[r * per_round : (r + 1) * per_round]
    for name, (forward, step) in sides.items():
      for kind, fn in (("forward", forward), ("step", step)):
        for b in chunk:
          t0 = time.perf_counter()
          fn(b)
          times[name][kind].append(1e3 * (time.perf_counter() - t0))
  rows = {}
  for name, t in times.items():
    fwd, stp = statistics.median(t["forward"]), statistics.median(t["step"])
    rows[name] = {"forward_ms": fwd, "step_ms": stp, "backward_update_ms": stp - fwd, "bwd_over_fwd": (stp - fwd) / fwd}
  print(
    f"GPT-2 {args.model}: {s['layers']} layers, d {s['d_model']}, {s['heads']} heads, ctx {s['ctx']}, batch "
    f"{s['batch']}, vocab {s['vocab']} ({n_params:,} params); {args.threads} thread(s); median of "
    f"{per_round * args.rounds} steps in {args.rounds} interleaved rounds"
  )
  print(f"{'':16} {'forward ms':>11} {'step ms':>9} {'bwd+upd ms':>11} {'bwd+upd / fwd':>14}")
  for name, r in rows.items():
    print(
      f"{name:16} {r['forward_ms']:11.2f} {r['step_ms']:9.2f} {r['backward_update_ms']:11.2f} {r['bwd_over_fwd']:14.2f}"
    )
  ratios = {}
  for other in ("torch eager", "torch.compile"):
    if other in rows:
      ratios[f"hybridjax step / {other} step"] = rows["hybridjax"]["step_ms"] / rows[other]["step_ms"]
  for k, v in ratios.items():
    print(f"{k}: {v:.2f}x")
  out = {"shape": s, "threads": args.threads, "steps": per_round * args.rounds, "rows": rows, "ratios": ratios}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
