"""The compiled GPT-2 training step's temporary memory, today's attention and loss against the new ones.

  python scripts/memory_analysis.py                      # 124m at batch 4 x 1024, on this machine's backend
  python scripts/memory_analysis.py --json=docs/results/gpu/memory-analysis-124m.json
  python scripts/memory_analysis.py --table docs/results/gpu/memory-analysis-124m.json  # as markdown, and exit

The baseline driver's step (`loop.baseline.make_train_step`: `optim.train_step` with the preset's
optimizer, jitted and donated) is lowered with `jax.ShapeDtypeStruct` arguments and compiled, nothing
allocated and nothing run, once per variant of the model's `attention` and `loss_chunk`; reported is
XLA's `compiled.memory_analysis()`: `temp_size_in_bytes`, the step's scratch memory beside its
arguments and outputs, against the float32 logits' size (batch x time x vocabulary x 4 bytes), which
the whole-logits loss holds. It compiles for the backend jax runs on (XLA:CPU here; a GPU's figures
differ, and cuDNN's path compiles on an NVIDIA GPU only). It times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a clone without installing

# name -> (model.attention, model.loss_chunk); the first is today's path.
VARIANTS = {
  "today (einsum attention, whole-logits loss)": ("einsum", 0),
  "chunked loss": ("einsum", 128),
  "chunked loss, XLA attention": ("xla", 128),
}


def step_memory(preset: str, batch: int, attention: str, loss_chunk: int) -> dict[str, int]:
  """XLA's memory analysis of `preset`'s compiled training step at `batch` sequences of its context."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  from experiments.configs import gpt2_small
  from hybridjax import optim
  from hybridjax.loop import baseline
  from hybridjax.models import gpt2

  c = gpt2_small.get_config(preset)
  cfg = dataclasses.replace(gpt2.GPT2Config(**c.model.to_dict()), attention=attention, loss_chunk=loss_chunk)
  model = gpt2.GPT2(cfg)
  tx = optim.make_optimizer(c.optim)
  tokens = jax.ShapeDtypeStruct((batch, cfg.n_ctx), jnp.int32)
  state = jax.eval_shape(
    lambda: optim.init_train_state(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"], tx)
  )
  step = baseline.make_train_step(gpt2.make_loss_fn(model), tx)
  schedule = optim.make_schedule(c.optim, c.trainer.steps)
  compiled = step.lower(state, {"inputs": tokens, "targets": tokens}, schedule).compile()
  analysis = compiled.memory_analysis()
  return {
    k: int(getattr(analysis, f"{k}_in_bytes"))
    for k in ("temp_size", "argument_size", "output_size", "alias_size", "generated_code_size")
  }


def _mib(n: float) -> str:
  return f"{n / 2**20:,.0f} MiB"


def markdown(result: dict) -> str:
  """A saved run (`--json`) as markdown: each variant's temporary memory and its drop from today's."""
  r = result
  out = [
    f"**{r['preset']}, batch {r['batch']} x {r['seq_len']}, vocabulary {r['vocab_size']:,}, {r['dtype']} compute, "
    f"XLA:{r['backend'].upper()}, jax {r['jax']}**: `{r['command']}`",
    "",
    "| variant | model.attention | model.loss_chunk | temp memory | drop from today's | drop / float32 logits |",
    "|---|---|---|---|---|---|",
  ]
  for name, v in r["variants"].items():
    out.append(
      f"| {name} | {v['attention']} | {v['loss_chunk']} | {_mib(v['temp_size'])} | {_mib(v['temp_drop'])} | "
      f"{v['temp_drop'] / r['logits_f32_bytes']:.2f} |"
    )
  out += ["", f"The float32 logits (batch x time x vocabulary x 4 bytes): {_mib(r['logits_f32_bytes'])}."]
  return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", default="124m")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--json", default="", help="also write the figures to this file")
  p.add_argument("--table", default="", help="print a saved run (a --json file) as markdown, and exit")
  args = p.parse_args(argv)
  if args.table:
    with open(args.table) as f:
      print(markdown(json.load(f)), end="")
    return {}

  import jax

  from experiments.configs import gpt2_small

  model = gpt2_small.get_config(args.preset).model
  out = {
    "command": " ".join(["python scripts/memory_analysis.py", *(sys.argv[1:] if argv is None else argv)]),
    "preset": args.preset,
    "batch": args.batch,
    "seq_len": model.n_ctx,
    "vocab_size": model.vocab_size,
    "dtype": model.dtype,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "logits_f32_bytes": args.batch * model.n_ctx * model.vocab_size * 4,
    "variants": {},
  }
  for name, (attention, loss_chunk) in VARIANTS.items():
    figures = step_memory(args.preset, args.batch, attention, loss_chunk)
    out["variants"][name] = {"attention": attention, "loss_chunk": loss_chunk, **figures}
    print(f"{name}: temp {figures['temp_size'] / 2**20:,.0f} MiB", flush=True)
  today = next(iter(out["variants"].values()))["temp_size"]
  for v in out["variants"].values():
    v["temp_drop"] = today - v["temp_size"]
  print(f"the float32 logits: {out['logits_f32_bytes'] / 2**20:,.0f} MiB")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
      f.write("\n")
  return out


if __name__ == "__main__":
  main()
