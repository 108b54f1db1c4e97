"""TD losses from rlax for Q-networks and C51 networks, batched with vmap.

A loss is a small frozen dataclass of hyperparameters with a pure `__call__`,
so DQN and C51 share one learner and differ only in loss and network.
"""

import dataclasses
from typing import Callable, Dict, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import rlax

from acme_jax_dqn.networks import NetworkOutput
from acme_jax_dqn.types import Params, Transition

ApplyFn = Callable[[Params, chex.Array], NetworkOutput]


class LossExtras(NamedTuple):
  td_error: chex.Array  # [B] TD errors on expected Q-values (for logging).
  priorities: chex.Array  # [B] new priorities for prioritized replay.
  metrics: Dict[str, chex.Array]


def _weighted_mean(per_example: chex.Array, weights: chex.Array,
                   mask: chex.Array) -> chex.Array:
  """Mean of `weights * per_example` over the unmasked examples."""
  return jnp.sum(per_example * weights * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _td_metrics(td_error, q_tm1, mask) -> Dict[str, chex.Array]:
  count = jnp.maximum(jnp.sum(mask), 1.0)
  return {
      "td_error_mean": jnp.sum(td_error * mask) / count,
      "td_error_abs_mean": jnp.sum(jnp.abs(td_error) * mask) / count,
      "q_mean": jnp.mean(q_tm1),
      "q_min": jnp.min(q_tm1),
      "q_max": jnp.max(q_tm1),
  }


def _defaults(batch: Transition, weights, mask):
  batch_size = batch.action.shape[0]
  if weights is None:
    weights = jnp.ones((batch_size,), jnp.float32)
  if mask is None:
    mask = jnp.ones((batch_size,), jnp.float32)
  return weights, mask


@dataclasses.dataclass(frozen=True)
class QLearningLoss:
  """Q-learning (Mnih et al. 2015) or double Q-learning (van Hasselt et al. 2016).

  Attributes:
    double_q: select the bootstrap action with the online network and
      evaluate it with the target network (Double DQN).
    huber_delta: Huber loss threshold; 0 gives the squared loss 0.5 * td**2.

  Rewards arrive as stored in replay; clipping (`reward_clip`) acts on
  each env reward before the n-step sum, in the adders.
  """
  double_q: bool = False
  huber_delta: float = 1.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = _defaults(batch, weights, mask)
    q_tm1 = apply_fn(online_params, batch.observation).q_values  # [B, A]
    q_t_value = apply_fn(target_params, batch.next_observation).q_values  # [B, A]
    if self.double_q:
      q_t_selector = apply_fn(online_params, batch.next_observation).q_values
      td_error = jax.vmap(rlax.double_q_learning)(
          q_tm1, batch.action, batch.reward, batch.discount, q_t_value,
          q_t_selector)
    else:
      td_error = jax.vmap(rlax.q_learning)(
          q_tm1, batch.action, batch.reward, batch.discount, q_t_value)
    if self.huber_delta > 0:
      per_example = rlax.huber_loss(td_error, self.huber_delta)
    else:
      per_example = rlax.l2_loss(td_error)
    loss = _weighted_mean(per_example, weights, mask)
    td_error = jax.lax.stop_gradient(td_error)
    metrics = _td_metrics(td_error, jax.lax.stop_gradient(q_tm1), mask)
    return loss, LossExtras(td_error=td_error, priorities=jnp.abs(td_error),
                            metrics=metrics)


@dataclasses.dataclass(frozen=True)
class CategoricalLoss:
  """C51 cross-entropy loss (Bellemare et al. 2017), optionally with double Q.

  The target distribution is projected onto the fixed support by rlax. New
  priorities are the per-example cross-entropy, as in Rainbow.

  Attributes:
    double_q: select the bootstrap action by the online network's Q-values.
  """
  double_q: bool = False

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = _defaults(batch, weights, mask)
    out_tm1 = apply_fn(online_params, batch.observation)
    out_t = apply_fn(target_params, batch.next_observation)
    if self.double_q:
      q_t_selector = apply_fn(online_params, batch.next_observation).q_values
      per_example = jax.vmap(
          rlax.categorical_double_q_learning,
          in_axes=(None, 0, 0, 0, 0, None, 0, 0))(
              out_tm1.atoms, out_tm1.logits, batch.action, batch.reward,
              batch.discount, out_t.atoms, out_t.logits, q_t_selector)
    else:
      q_t_selector = out_t.q_values
      per_example = jax.vmap(
          rlax.categorical_q_learning, in_axes=(None, 0, 0, 0, 0, None, 0))(
              out_tm1.atoms, out_tm1.logits, batch.action, batch.reward,
              batch.discount, out_t.atoms, out_t.logits)
    loss = _weighted_mean(per_example, weights, mask)
    # TD error on expected values, reported for comparison with DQN runs.
    q_tm1 = jax.lax.stop_gradient(out_tm1.q_values)
    q_t_value = jax.lax.stop_gradient(out_t.q_values)
    next_action = jnp.argmax(q_t_selector, axis=-1)
    bootstrap = jnp.take_along_axis(q_t_value, next_action[:, None], axis=-1)[:, 0]
    q_taken = jnp.take_along_axis(q_tm1, batch.action[:, None], axis=-1)[:, 0]
    td_error = batch.reward + batch.discount * bootstrap - q_taken
    metrics = _td_metrics(td_error, q_tm1, mask)
    metrics["c51_clipped_mass"] = _clipped_mass(out_t, next_action, batch, mask)
    return loss, LossExtras(td_error=td_error,
                            priorities=jax.lax.stop_gradient(per_example),
                            metrics=metrics)


def _clipped_mass(out_t: NetworkOutput, next_action: chex.Array, batch: Transition,
                  mask: chex.Array) -> chex.Array:
  """Mean share of the target distribution whose Bellman target lies outside the support.

  The projection (rlax's, as inside the C51 loss) puts such mass on the
  edge atom nearest to it, so values beyond [v_min, v_max] are silently cut.
  Near 1, the support does not reach the returns of the task. Mass whose
  target lands exactly on an edge atom (returns at v_max) does not count.
  """
  atoms = jax.lax.stop_gradient(out_t.atoms)
  probs_t = jax.nn.softmax(jax.lax.stop_gradient(out_t.logits))  # [B, A, N]
  probs_next = jnp.take_along_axis(probs_t, next_action[:, None, None], axis=1)[:, 0]
  target_z = batch.reward[:, None] + batch.discount[:, None] * atoms[None]  # [B, N]
  outside = (target_z < atoms[0]) | (target_z > atoms[-1])
  clipped = jnp.sum(probs_next * outside, axis=-1)  # [B]
  return jnp.sum(clipped * mask) / jnp.maximum(jnp.sum(mask), 1.0)
