"""Conversion between `models.gpt2`'s parameters and a Hugging Face ``GPT2LMHeadModel`` state dict.

Parameter names map 1:1 onto HF names and dense kernels use the (in, out) layout of HF's ``Conv1D``,
so conversion is a pure renaming. Kept apart from the model so that the code a training run imports
(which the run cache hashes) holds no reader of PyTorch checkpoints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from hybridjax.models.gpt2 import GPT2Config, Params

_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
_LAYER_RE = re.compile(r"^h\.(\d+)\.")


def _hf_layout(
  config: GPT2Config,
) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
  """HF name (without prefix) -> (flax path, shape) for every parameter."""
  # The init changes only where training starts: a model trained from any init converts.
  options = [name for name in config.speedrun_options if name != "init"]
  if options:
    raise ValueError(
      f"the speedrun options {options} have no Hugging Face GPT-2 equivalent: only the plain "
      "GPT-2 (every model option off but model.init) converts to and from a Hugging Face checkpoint"
    )
  d = config.d_model
  # A block's layers: a LayerNorm's weight and bias are (d,), a dense layer's (in, out) and (out,).
  layers = {
    "ln_1": (), "attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d),
    "ln_2": (), "mlp.c_fc": (d, 4 * d), "mlp.c_proj": (4 * d, d),
  }  # fmt: skip
  shapes = {"wte.weight": (config.vocab_size, d), "wpe.weight": (config.n_ctx, d)}
  for i in range(config.n_layer):
    for layer, kernel in layers.items():
      shapes.update({f"h.{i}.{layer}.weight": kernel or (d,), f"h.{i}.{layer}.bias": kernel[1:] or (d,)})
  shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
  return {name: (_flax_path(name), shape) for name, shape in shapes.items()}


def _flax_path(name: str) -> tuple[str, ...]:
  """The flax path of the HF parameter `name`: block `h.i` is `h_i`, and a `weight` is a table's
  `embedding`, a LayerNorm's `scale` or a dense layer's `kernel`."""
  *path, leaf = re.sub(r"^h\.(\d+)", r"h_\1", name).split(".")
  if leaf == "weight":
    leaf = "embedding" if path[-1] in ("wte", "wpe") else "scale" if path[-1].startswith("ln") else "kernel"
  return (*path, leaf)


def from_hf_state_dict(mapping: Mapping[str, Any], n_head: int = 12) -> tuple[GPT2Config, Params]:
  """Converts a Hugging Face GPT-2 state dict into a config and Flax params.

  Args:
    mapping: HF parameter name -> array (numpy or anything ``np.asarray``
      accepts). Names may carry the ``transformer.`` prefix or not. Buffers
      (``.attn.bias``, ``.attn.masked_bias``) are ignored; ``lm_head.weight``,
      if present, must equal ``wte.weight`` (tied) and is otherwise ignored.
    n_head: number of attention heads (not recoverable from shapes).

  Returns:
    ``(config, params)`` where ``params`` has exactly the structure and shapes
    of ``GPT2(config).init(...)['params']``, as float32 jax arrays.

  Raises:
    ValueError: on missing or unexpected keys, wrong shapes, or an untied
      ``lm_head.weight``.
  """
  arrays: dict[str, np.ndarray] = {}
  lm_head = None
  for raw_name, value in mapping.items():
    name = raw_name.removeprefix("transformer.")
    if name.endswith(_IGNORED_SUFFIXES):
      continue
    if name == "lm_head.weight":
      lm_head = np.asarray(value)
      continue
    if name in arrays:
      raise ValueError(f"duplicate parameter {name!r} (with and without prefix)")
    arrays[name] = np.asarray(value)

  for required in ("wte.weight", "wpe.weight"):
    if required not in arrays:
      raise ValueError(f"missing key: {required!r} (cannot infer the config)")
  wte, wpe = arrays["wte.weight"], arrays["wpe.weight"]
  if wte.ndim != 2 or wpe.ndim != 2:
    raise ValueError(f"wte.weight and wpe.weight must be 2-D, got shapes {wte.shape} and {wpe.shape}")
  layers = {int(m.group(1)) for n in arrays if (m := _LAYER_RE.match(n))}
  config = GPT2Config(
    vocab_size=int(wte.shape[0]),
    n_ctx=int(wpe.shape[0]),
    n_layer=max(layers, default=-1) + 1,
    n_head=n_head,
    d_model=int(wte.shape[1]),
  )
  config.validate()

  layout = _hf_layout(config)
  problems = [
    f"{what} keys: {sorted(keys)}"
    for what, keys in (("missing", set(layout) - set(arrays)), ("unexpected", set(arrays) - set(layout)))
    if keys
  ]
  bad_shapes = [
    f"{name}: expected {shape}, got {arrays[name].shape}"
    for name, (_, shape) in layout.items()
    if name in arrays and arrays[name].shape != shape
  ]
  if bad_shapes:
    problems.append(f"wrong shapes: {bad_shapes}")
  if lm_head is not None and (lm_head.shape != wte.shape or not np.array_equal(lm_head, wte)):
    problems.append("lm_head.weight differs from wte.weight; only tied output embeddings are supported")
  if problems:
    raise ValueError(f"invalid GPT-2 state dict (inferred {config}):\n  " + "\n  ".join(problems))

  return config, traverse_util.unflatten_dict(
    {path: jnp.asarray(arrays[n], jnp.float32) for n, (path, _) in layout.items()}
  )


def to_hf_state_dict(params: Params, config: GPT2Config) -> dict[str, np.ndarray]:
  """Converts Flax params into a Hugging Face ``GPT2LMHeadModel`` state dict.

  Names carry the ``transformer.`` prefix; ``lm_head.weight`` is omitted since
  it is tied to ``transformer.wte.weight``. Arrays are float32 numpy.
  """
  out, flat = {}, traverse_util.flatten_dict(params)
  for name, (path, shape) in _hf_layout(config).items():
    array = np.asarray(flat[path], dtype=np.float32)
    if array.shape != shape:
      raise ValueError(f"{'/'.join(path)}: expected {shape}, got {array.shape}")
    out[f"transformer.{name}"] = array
  return out


def load_hf_checkpoint(path: str | os.PathLike[str], n_head: int = 12) -> tuple[GPT2Config, Params]:
  """Loads a local HF GPT-2 checkpoint (``.safetensors`` or PyTorch ``.bin``).

  ``path`` may also be a directory holding ``model.safetensors`` or
  ``pytorch_model.bin``. Reading ``.bin`` files needs torch.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    for candidate in ("model.safetensors", "pytorch_model.bin"):
      if os.path.isfile(os.path.join(path, candidate)):
        path = os.path.join(path, candidate)
        break
    else:
      raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in directory {path!r}")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"checkpoint file not found: {path!r}")

  if path.endswith(".safetensors"):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

    mapping = load_file(path)
  elif path.endswith((".bin", ".pt", ".pth")):
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(
        f"reading the PyTorch checkpoint {path!r} needs torch, which is not "
        "installed; convert it to .safetensors instead (e.g. with "
        "`transformers` or `safetensors.torch.save_file` on a machine with "
        "torch)"
      ) from e
    state = torch.load(path, map_location="cpu", weights_only=True)
    mapping = {k: v.detach().to(torch.float32).numpy() for k, v in state.items()}
  else:
    raise ValueError(f"unsupported checkpoint format {path!r}; expected .safetensors or .bin")
  return from_hf_state_dict(mapping, n_head=n_head)
