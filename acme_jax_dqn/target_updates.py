"""Target-network updates: the periodic hard copy or Polyak average, as a select or in a loop."""

import contextlib

import chex
import jax
import jax.numpy as jnp
import optax

from acme_jax_dqn.types import Params

_TARGET_UPDATE_LOOP = False


@contextlib.contextmanager
def target_update_in_loop():
  """Within the block, learner steps traced move the target in a loop of 0 or 1 trips.

  `update_target` otherwise picks, every step, between the new target and
  the old with an element-wise select, which reads both trees and writes
  the target whether or not the update is due. In the loop the step runs
  the update only when it is due. Vmapped over seeds, JAX batches the
  loop's predicate: the loop runs once when any seed's update is due and
  selects per seed inside it, so a batch of seeds reads and writes its
  target only every `period` steps. Each step then tests the loop's
  predicate, which on a GPU the host reads:
  `agents.dqn.seed_layout.target_update_loop` says where the loop runs.
  The same values either way. JAX's jit cache does not key on this
  setting: jit functions anew inside the block.
  """
  global _TARGET_UPDATE_LOOP  # pylint: disable=global-statement
  previous, _TARGET_UPDATE_LOOP = _TARGET_UPDATE_LOOP, True
  try:
    yield
  finally:
    _TARGET_UPDATE_LOOP = previous


def traced_anew(fn):
  """`fn` as a new function object, for a loop body that may trace a learner step.

  JAX keeps the jaxprs of loop bodies in a cache keyed by the function and
  its input types, not by `target_update_in_loop`: a body traced before the
  block would keep its select inside it.
  """
  return lambda *args: fn(*args)


def update_target(online_params: Params, target_params: Params, updates: chex.Array,
                  period: int, tau: float, applied: chex.Array = True) -> Params:
  """Every `period` applied updates, target <- tau * online + (1 - tau) * target.

  tau = 1 is the hard copy of Mnih et al. 2015; tau < 1 with period 1 is
  Polyak averaging (Lillicrap et al. 2016). `updates` counts the updates
  applied to the online params so far (`applied_updates`); `applied` says
  whether this step applied one, so that under gradient accumulation the
  target moves only when the online params did. Within
  `target_update_in_loop` the update runs in a loop of 0 or 1 trips.
  """
  def moved(target):
    if tau >= 1.0:
      return online_params  # Exact copy, no arithmetic on the target.
    return optax.incremental_update(online_params, target, tau)

  update_now = jnp.logical_and(applied, updates % period == 0)
  if _TARGET_UPDATE_LOOP:
    return jax.lax.while_loop(lambda due_target: due_target[0],
                              lambda due_target: (jnp.zeros((), bool), moved(due_target[1])),
                              (update_now, target_params))[1]
  return jax.tree.map(lambda new, old: jnp.where(update_now, new, old),
                      moved(target_params), target_params)
