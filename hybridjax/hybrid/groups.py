"""Parameter groups: a static grouping of a param tree's leaves, and per-group sums over it
(docs/design.md, "Features").

Groups are derived from the param tree's paths, so they work for any model: with `grouping='kind'`
repeated blocks (`h_0`, `h_1`, ... with identical structure and shapes) fall into one group per
layer kind, so the number of groups does not grow with depth. Every per-group quantity is a segment
sum over leaves with static group ids: no params-sized temporaries beyond the elementwise products.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class ParamGroups:
  """Static grouping of a param tree's leaves. `leaf_group[i]` is the group of leaf i."""

  names: tuple[str, ...]
  leaf_group: tuple[int, ...]
  treedef: Any

  @property
  def n_groups(self) -> int:
    return len(self.names)


def _path_parts(path) -> list[str]:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return parts


def param_groups(params: Any, grouping: str = "kind") -> ParamGroups:
  """Groups the leaves of `params`.

  Args:
    params: a param pytree (arrays or ShapeDtypeStructs).
    grouping: 'leaf' (one group per leaf), 'global' (one group), or 'kind': one group per leaf
      path after replacing the index of repeated, identically shaped sibling blocks by '*'.
  """
  leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths = [_path_parts(p) for p, _ in leaves_with_path]
  shapes = [tuple(x.shape) for _, x in leaves_with_path]
  if grouping == "global":
    return ParamGroups(("all",), tuple(0 for _ in paths), treedef)
  if grouping == "leaf":
    names = tuple("/".join(p) for p in paths)
    return ParamGroups(names, tuple(range(len(paths))), treedef)
  if grouping != "kind":
    raise ValueError(f"--config.hybrid.grouping must be 'kind', 'leaf' or 'global', got {grouping!r}")

  # Signature of the subtree under each (prefix, component): the sorted (rest-of-path, shape) set.
  def subtree_sig(prefix: tuple[str, ...]) -> tuple:
    n = len(prefix)
    return tuple(sorted((tuple(p[n:]), s) for p, s in zip(paths, shapes) if tuple(p[:n]) == prefix))

  generic = []
  for p in paths:
    out = []
    merged = False  # only the outermost repeated level is merged (h_* but not h_*/ln_*)
    for depth, comp in enumerate(p):
      m = re.fullmatch(r"(.*?)_?(\d+)", comp)
      if m and depth < len(p) - 1 and not merged:
        stem = m.group(1)
        prefix = tuple(p[:depth])
        siblings = {
          q[depth]
          for q in paths
          if tuple(q[:depth]) == prefix and len(q) > depth and re.fullmatch(rf"{re.escape(stem)}_?\d+", q[depth])
        }
        sig = subtree_sig(prefix + (comp,))
        if len(siblings) > 1 and all(subtree_sig(prefix + (s,)) == sig for s in siblings):
          out.append(f"{stem}_*" if "_" in comp else f"{stem}*")
          merged = True
          continue
      out.append(comp)
    generic.append("/".join(out))
  names: list[str] = []
  leaf_group = []
  for g in generic:
    if g not in names:
      names.append(g)
    leaf_group.append(names.index(g))
  return ParamGroups(tuple(names), tuple(leaf_group), treedef)


def group_sum(groups: ParamGroups, per_leaf: list[jax.Array]) -> jax.Array:
  """Sums per-leaf scalars into per-group totals, shape (G,)."""
  ids = np.asarray(groups.leaf_group, np.int32)
  return jnp.zeros((groups.n_groups,), jnp.float32).at[ids].add(jnp.stack(per_leaf).astype(jnp.float32))


def group_sq_norms(groups: ParamGroups, tree: Any) -> jax.Array:
  """Per-group squared L2 norms of `tree`, shape (G,)."""
  return group_sum(groups, [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)])


def group_dots(groups: ParamGroups, a: Any, b: Any) -> jax.Array:
  """Per-group inner products <a_g, b_g>, shape (G,)."""
  return group_sum(
    groups,
    [jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))],
  )


def add_scaled_by_group(groups: ParamGroups, params: Any, alpha: jax.Array, direction: Any) -> Any:
  """params + sum_g alpha_g * direction_g, leafwise: the predicted step (and, negated, the rollback)."""
  p_leaves = jax.tree.leaves(params)
  d_leaves = jax.tree.leaves(direction)
  out = [p + (alpha[g] * d).astype(p.dtype) for g, p, d in zip(groups.leaf_group, p_leaves, d_leaves)]
  return jax.tree.unflatten(groups.treedef, out)


def safe_log(x: jax.Array) -> jax.Array:
  return jnp.log(jnp.maximum(x, _EPS))
