"""Parameter groups by name: which leaves of a model's params each optimizer group trains (the hidden
matrices for Muon, the embeddings, the head, the scalars), as pytrees of labels for `optax.partition`."""

from __future__ import annotations

from typing import Any

import jax


def muon_labels(params: Any) -> Any:
  """'muon' for the hidden matrices, 'adamw' for the rest: a pytree like `params` of labels.

  Muon orthogonalises 2-D updates, which suits the hidden (attention and MLP) matrices only; as in
  the modded-nanogpt recipes, embeddings (any leaf under a key named `embedding`, which includes a
  head tied to the token embedding), an untied head (`lm_head`), LayerNorm parameters and biases
  (every leaf with ndim != 2) stay on AdamW.
  """

  return jax.tree.map(lambda label: "muon" if label.startswith("muon") else "adamw", muon_group_labels(params))


def muon_group_labels(params: Any, tied_label: str = "head") -> Any:
  """The speedrun's parameter groups, a pytree like `params` of labels:

  * 'muon': the hidden matrices; 'muon_qkv': a fused query-key-value matrix (`c_attn`), which Muon
    orthogonalises as its three (d, d) blocks, as it would separate q, k and v projections;
  * 'embed': the embedding tables (token, positions, value embeddings);
  * 'head': the output head, `lm_head`; a token embedding tied to the head is labelled `tied_label`
    ('head', or 'tied_head' when it has settings of its own: `tied_head_settings`);
  * 'scalar': every leaf with ndim != 2 (biases, norm scales, the learned mixing scalars).
  """
  tied = "lm_head" not in params

  def label(path, p):
    keys = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    if "embedding" in keys:
      return tied_label if tied and keys[0] == "wte" else "embed"
    if keys[0] == "lm_head":
      return "head"
    if p.ndim != 2:
      return "scalar"
    return "muon_qkv" if keys[-2:] == ("c_attn", "kernel") else "muon"

  return jax.tree_util.tree_map_with_path(label, params)
