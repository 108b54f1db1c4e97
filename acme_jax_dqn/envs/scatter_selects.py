"""An environment step with each single-index scatter written as a select, for compiled loops.

gymnax's MinAtar games and bsuite tasks draw their observations and move
their pieces with `x.at[i, j, c].set(v)`: one `scatter` each, a dozen in a
Breakout step with its auto-reset, a hundred in Freeway's. XLA runs every
scatter as a kernel of its own (it updates its operand in place and fuses
only what computes the scatter's inputs): on a GPU, where one seed's
iteration waits on how many kernels it launches, they are about a tenth of
the kernels of a Breakout learning iteration. A scatter of one index whose
window spans each of its other dimensions whole writes what a select over
an iota mask writes, and XLA fuses a select with the ops around it.

`scatters_as_selects(fn)` traces `fn` to a jaxpr and evaluates it with each
such scatter (set, add, multiply, min, max, with int32 indices as
`jnp.ndarray.at` makes them) as that select. Every other equation binds as
traced: jitted calls are inlined, control flow and custom-derivative calls
bind as they are (a scatter inside them stays a scatter), and so do
scatters of several indices, of narrower windows, of other index types and
`.at[...].apply`'s. Where the scatter writes, the select takes the same
combination of the operand's and the update's elements, and elsewhere the
operand's: a set moves values without arithmetic, so its result is the
same bit for bit on any backend (an add or multiply may fuse differently
on a GPU). A window out of bounds is dropped (the `FILL_OR_DROP` and
`PROMISE_IN_BOUNDS` modes) or its start clamped into bounds (`CLIP`, as
JAX lowers it). tests/acme_jax_dqn/test_scatter_selects.py checks both
against JAX's own scatters and gymnax's steps.
"""

import functools
from typing import Any, Callable, List, Optional, Sequence

import jax
from jax import lax
from jax.extend import core as jex_core
from jax.extend.core import primitives
import jax.numpy as jnp

# How each scatter primitive combines the operand's element with the update's.
_COMBINE = {
    primitives.scatter_p: lambda operand, update: update,
    primitives.scatter_add_p: lax.add,
    primitives.scatter_mul_p: lax.mul,
    primitives.scatter_min_p: lax.min,
    primitives.scatter_max_p: lax.max,
}


def _window_dims(eqn: jex_core.JaxprEqn) -> Optional[List[int]]:
  """The operand dimensions a rewritable scatter's update spans (None: not rewritable).

  Rewritable: one int32 index vector, no batching dimensions, and an update
  that is one window spanning each operand dimension it does not insert
  whole.
  """
  if eqn.primitive not in _COMBINE or (eqn.primitive is primitives.scatter_p
                                       and eqn.params["update_jaxpr"] is not None):
    return None  # `.at[...].apply(f)` binds a set with `f` as its update computation.
  operand, indices, updates = (v.aval for v in eqn.invars[:3])
  numbers = eqn.params["dimension_numbers"]
  if (len(indices.shape) != 1 or indices.dtype != jnp.int32 or numbers.operand_batching_dims
      or numbers.scatter_indices_batching_dims
      or indices.shape[0] != len(numbers.scatter_dims_to_operand_dims)):
    return None
  window = [d for d in range(len(operand.shape)) if d not in numbers.inserted_window_dims]
  if (tuple(numbers.update_window_dims) != tuple(range(len(updates.shape)))
      or [operand.shape[d] for d in window] != list(updates.shape)):
    return None
  return window


def _as_select(eqn: jex_core.JaxprEqn, window: Sequence[int], operand, indices, updates):
  """What the scatter `eqn` computes, as a select over an iota mask."""
  numbers = eqn.params["dimension_numbers"]
  clip = eqn.params["mode"] == lax.GatherScatterMode.CLIP
  operand = jnp.asarray(operand, eqn.invars[0].aval.dtype)
  indices = jnp.asarray(indices, eqn.invars[1].aval.dtype)
  updates = jnp.asarray(updates, eqn.invars[2].aval.dtype)
  shape = operand.shape
  mask = jnp.ones(shape, bool)
  for position, d in enumerate(numbers.scatter_dims_to_operand_dims):
    start = indices[position]
    size = shape[d] if d in window else 1
    if clip:  # JAX clamps the start so that the window fits.
      start = lax.clamp(jnp.int32(0), start, jnp.int32(shape[d] - size))
    if d in window:  # Whole along d: in bounds only from 0.
      mask = mask & (start == 0)
    else:
      mask = mask & (lax.broadcasted_iota(jnp.int32, shape, d) == start)
  for d in numbers.inserted_window_dims:  # Inserted, with no index: at 0.
    if d not in numbers.scatter_dims_to_operand_dims:
      mask = mask & (lax.broadcasted_iota(jnp.int32, shape, d) == 0)
  update = lax.broadcast_in_dim(updates, shape, tuple(window))
  return lax.select(mask, _COMBINE[eqn.primitive](operand, update), operand)


def _has_rewritable(jaxpr: jex_core.Jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if _window_dims(eqn) is not None:
      return True
    if eqn.primitive is primitives.jit_p and _has_rewritable(eqn.params["jaxpr"].jaxpr):
      return True
  return False


def _evaluate(jaxpr: jex_core.Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> List[Any]:
  """`jaxpr` applied to `args`, with its rewritable scatters (and its jitted calls') as selects."""
  values = dict(zip(jaxpr.constvars, consts))
  values.update(zip(jaxpr.invars, args))

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else values[v]

  for eqn in jaxpr.eqns:
    inputs = [read(v) for v in eqn.invars]
    window = _window_dims(eqn)
    outputs = None
    with eqn.ctx.manager:  # The settings the equation was traced under, as eval_jaxpr binds.
      if window is not None:
        select = _as_select(eqn, window, *inputs)
        if jax.typeof(select) == eqn.outvars[0].aval:  # Same type, weak or not.
          outputs = [select]
      elif eqn.primitive is primitives.jit_p:  # Inlined, so its scatters are rewritten too.
        inner = eqn.params["jaxpr"]
        outputs = _evaluate(inner.jaxpr, inner.consts, inputs)
      if outputs is None:
        outputs = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
        if not eqn.primitive.multiple_results:
          outputs = [outputs]
    values.update(zip(eqn.outvars, outputs))
  return [read(v) for v in jaxpr.outvars]


def scatters_as_selects(fn: Callable) -> Callable:
  """`fn`, computing the same values with its single-index scatters as selects (see above).

  `fn` takes and returns pytrees of arrays; it is traced at each call (under
  a `jit`, once). One with no scatter to rewrite is called as it is.
  """

  @functools.wraps(fn)
  def rewritten(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not _has_rewritable(closed.jaxpr):
      return fn(*args)
    outputs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(out_shape), outputs)

  return rewritten
