"""The compiled trainer's loops: a scan whose carry rides packed, and a scan that sums.

Shared by anakin mode's DQN trainer (`acme_jax_dqn.anakin`) and PQN's
(`acme_jax_dqn.anakin_pqn`).
"""

from typing import Optional

import jax
from jax import flatten_util
import jax.numpy as jnp

from acme_jax_dqn import trees


def zeros_of_output(body, state):
  """Zeros shaped as `body(state, None)`'s second output."""
  shapes = jax.eval_shape(lambda s: body(s, None)[1], state)
  return jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), shapes)


def rides_packed(path, leaf) -> bool:
  """Whether a training loop carries `leaf`, at `path` in its carry, in its packed word vector
  (`carry_scan`): the environments, observations, returns, n-step window, counters and keys;
  the learner's non-float leaves of up to 64 elements (step counts, keys); and the replay's
  leaves of up to 64 elements outside its storage (index, flags, the largest priority). The
  learner's float leaves (parameters, optimizer moments), which its update kernels write in
  place, the replay's storage (`experience`, the sum tree's nodes) and leaves of more than
  2**16 elements stay apart."""
  names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
  if not names:
    return False
  if names[0] == "learner":
    return not jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.size <= 64
  if names[0] == "buffer":
    return "experience" not in names and "nodes" not in names and leaf.size <= 64
  return leaf.size <= 1 << 16


def carry_scan(body, state, xs=None, length: Optional[int] = None, unroll: int = 1,
               packed: bool = True):
  """`jax.lax.scan` of a training loop; with `packed`, the leaves `rides_packed` picks ride in
  one word vector (`trees.packed_carry_scan`: the same values; on a GPU fewer kernels per
  iteration, as XLA copies each carried leaf whose old value is read after its new one is
  written: the environment's state and observation, read again to store the transition)."""
  if not packed:
    return jax.lax.scan(body, state, xs, length=length, unroll=unroll)
  return trees.packed_carry_scan(body, state, xs, length, unroll, rides_packed)


def summed_scan(body, state, length: int, unroll: int = 1, packed: bool = True):
  """`length` calls of `body(state, None) -> (state, out)` in one loop (`unroll` calls per loop
  step, the carry packed as `carry_scan` packs it); returns the state and the outputs summed
  in the loop's carry, as one float32 vector (one add per call, not a write per leaf per call
  as stacked outputs would be). The sums come back as float32 leaves of the outputs' shapes
  (integer counts stay exact up to 2**24)."""
  as_float = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
  zeros, unravel = flatten_util.ravel_pytree(as_float(zeros_of_output(body, state)))

  def step(carry, _):
    state, total = carry
    state, out = body(state, None)
    return (state, total + flatten_util.ravel_pytree(as_float(out))[0]), None
  (state, total), _ = carry_scan(step, (state, zeros), None, length, unroll, packed)
  return state, unravel(total)
