"""Which attention path a GPT-2 computes (`GPT2Config.attention`).

Three paths compute the same causal softmax attention:

* 'einsum': the model's own two batched matmuls over (batch, heads, time, head_dim), the float32
  (T x T) scores masked with a lower triangle; the only path with attention dropout.
* 'xla': `jax.nn.dot_product_attention`'s XLA implementation over (batch, time, heads, head_dim):
  the same float32 scores and softmax, written by jax.
* 'cudnn': the same call with cuDNN's fused (flash) kernel, which never holds the scores; NVIDIA GPUs,
  bfloat16 or float16 compute, head_dim a multiple of 8 up to 128.

'auto' (`attention_implementation`) picks per backend: cuDNN on an NVIDIA GPU where it applies, XLA's
on any other GPU or TPU, and the einsum on CPU, where it keeps the CPU numerics bit for bit (whether
XLA's would be faster there is not measured); a model with dropout keeps the einsum everywhere.
"""

from __future__ import annotations

from typing import Any

import jax

ATTENTIONS = ("auto", "einsum", "xla", "cudnn")
"""`GPT2Config.attention`'s choices."""

_FUSED_DTYPES = ("bfloat16", "float16")  # cuDNN's fused kernel takes no float32


def current_backend() -> str:
  """The default backend as `attention_implementation` reads it: 'cpu', 'tpu', 'cuda' (an NVIDIA GPU)
  or 'rocm' (an AMD GPU)."""
  backend = jax.default_backend()
  if backend != "gpu":
    return backend
  return "rocm" if "rocm" in str(getattr(jax.devices()[0].client, "platform_version", "")).lower() else "cuda"


def attention_errors(model: dict[str, Any]) -> list[str]:
  """The problems of a model block's `attention` (one of `ATTENTIONS`, its field's check) with
  `dropout` and `dtype` (a mapping of `GPT2Config` fields; missing ones take their defaults), each
  naming the field and the fix."""
  attention, dropout, dtype = model.get("attention", "auto"), model.get("dropout", 0.0), model.get("dtype", "float32")
  errors = []
  if attention in ("xla", "cudnn") and dropout:
    errors.append(
      f"model.attention={attention!r} has no attention dropout, and model.dropout is {dropout}: set "
      "model.attention='einsum' (or 'auto', which picks it), or model.dropout=0"
    )
  if attention == "cudnn" and dtype not in _FUSED_DTYPES:
    errors.append(
      f"model.attention='cudnn' needs model.dtype in {_FUSED_DTYPES}, got {dtype!r}: set model.dtype='bfloat16', "
      "or model.attention='xla' (or 'auto') for float32"
    )
  return errors


def attention_implementation(config: Any, backend: str) -> str:
  """The path a model of `config` (a `GPT2Config`) computes on `backend` (`current_backend()`'s names;
  'gpu' reads as 'cuda'): 'einsum', 'xla' or 'cudnn', resolving 'auto'. Raises ValueError when an
  explicit 'cudnn' cannot run on `backend`."""
  backend = "cuda" if backend == "gpu" else backend
  if config.attention != "auto":
    if config.attention == "cudnn" and backend != "cuda":
      raise ValueError(
        f"model.attention='cudnn' runs on an NVIDIA GPU only, and this backend is {backend!r}: set "
        "--config.model.attention='auto' (or 'xla', or 'einsum')"
      )
    return config.attention
  if config.dropout or backend == "cpu":
    return "einsum"
  fits_cudnn = config.dtype in _FUSED_DTYPES and config.head_dim % 8 == 0 and config.head_dim <= 128
  return "cudnn" if backend == "cuda" and fits_cudnn else "xla"
