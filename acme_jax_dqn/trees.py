"""Pytrees across jit boundaries: packed into one array per dtype, copied, metrics stacked;
the global norm of a tree in one reduction."""

from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np


class TreePacker:
  """Packs a pytree's leaves into one flat array per dtype, and back.

  A jitted call pays a few microseconds per argument and per result on the
  CPU; a training state has ~30 leaves. Passing 3 packed arrays instead
  cut the local learner's call overhead by ~100 us on a 2-core machine.
  `pack` and `unpack` are jittable and exact (no dtype conversion).
  """

  def __init__(self, example: Any):
    leaves, self._treedef = jax.tree.flatten(example)
    self._dtypes: List[np.dtype] = sorted({np.dtype(x.dtype) for x in leaves}, key=str)
    self._slots: List[Tuple[int, int, int, Tuple[int, ...]]] = []  # (group, start, size, shape)
    offsets: Dict[np.dtype, int] = {d: 0 for d in self._dtypes}
    for x in leaves:
      dtype = np.dtype(x.dtype)
      size = int(np.prod(x.shape))
      self._slots.append((self._dtypes.index(dtype), offsets[dtype], size, tuple(x.shape)))
      offsets[dtype] += size

  def pack(self, tree: Any) -> Tuple[jax.Array, ...]:
    leaves = jax.tree.leaves(tree)
    groups = [[] for _ in self._dtypes]
    for (group, _, _, _), x in zip(self._slots, leaves):
      groups[group].append(jnp.ravel(x))
    return tuple(jnp.concatenate(g) for g in groups)

  def unpack(self, packed: Tuple[jax.Array, ...]) -> Any:
    leaves = [packed[group][start:start + size].reshape(shape)
              for group, start, size, shape in self._slots]
    return jax.tree.unflatten(self._treedef, leaves)


@jax.jit
def copy_tree(tree: Any) -> Any:
  """Fresh buffers for every leaf, in one compiled call (for warm-ups of donating jits)."""
  return jax.tree.map(jnp.copy, tree)


def pack_metrics(metrics: Dict[str, jax.Array]) -> Tuple[Tuple[str, ...], jax.Array]:
  """Scalar metrics as (names, one float32 vector): one result instead of many."""
  names = tuple(sorted(metrics))
  return names, jnp.stack([jnp.asarray(metrics[k], jnp.float32) for k in names])


def global_norm(tree: Any) -> jax.Array:
  """The L2 norm of every leaf of `tree` together, as `optax.tree.norm`, in one reduction.

  `optax.tree.norm` reduces each leaf on its own and adds the results: on
  a GPU one kernel per leaf. Here the leaves are joined first, so XLA
  reduces them in one (the learner step's norm without gradient clipping,
  compiled for an H200, bench/hlo_kernels.py --target=h200: 4 kernels fewer
  per learning iteration with a 3-layer MLP). The value agrees to float
  rounding.
  """
  return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate(
      [jnp.ravel(leaf) for leaf in jax.tree.leaves(tree)]))))
