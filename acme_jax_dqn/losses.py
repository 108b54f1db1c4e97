"""TD losses from rlax for Q, C51 and quantile networks, and the Munchausen target, batched with vmap.

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
  # The squared L2 norm of the loss's own gradient with respect to the online parameters (of the
  # loss as returned, not of a multiple of it), where the loss computes it beside the gradient
  # (the fused loss): the learner step then takes its gradient norm from here rather than
  # reading every gradient again. None: it does.
  grad_squared_norm: Optional[chex.Array] = None


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


def default_weights_and_mask(batch: Transition, weights, mask):
  """Ones for the importance weights and the mask a loss was not given."""
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
    weights, mask = default_weights_and_mask(batch, weights, mask)
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
    return _td_loss(td_error, q_tm1, weights, mask, self.huber_delta)


@dataclasses.dataclass(frozen=True)
class ReturnRegressionLoss:
  """Q(s, a) regressed on a return computed beforehand, e.g. PQN's Q(lambda) return.

  `batch` holds `observation`, `action` and `target_return` (leaves [B,
  ...]); no network is applied to a next observation, as the return
  already holds the bootstrap.

  Attributes:
    huber_delta: Huber loss threshold; 0 gives the squared loss 0.5 * td**2 (PQN's).
  """
  huber_delta: float = 0.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params, target_params: Params,
               batch, weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras); `target_params` is not used."""
    del target_params
    chex.assert_rank(batch.action, 1)
    weights, mask = default_weights_and_mask(batch, weights, mask)
    q_tm1 = apply_fn(online_params, batch.observation).q_values  # [B, A]
    td_error = batch.target_return - rlax.batched_index(q_tm1, batch.action)
    return _td_loss(td_error, q_tm1, weights, mask, self.huber_delta)


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
    weights, mask = default_weights_and_mask(batch, weights, mask)
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
    td_error = _expected_td_error(out_tm1.q_values, out_t.q_values, q_t_selector, batch)
    metrics = _td_metrics(td_error, jax.lax.stop_gradient(out_tm1.q_values), mask)
    next_action = jnp.argmax(jax.lax.stop_gradient(q_t_selector), axis=-1)
    metrics["c51_clipped_mass"] = _clipped_mass(out_t, next_action, batch, mask)
    return loss, LossExtras(td_error=td_error,
                            priorities=jax.lax.stop_gradient(per_example),
                            metrics=metrics)


@dataclasses.dataclass(frozen=True)
class QuantileLoss:
  """QR-DQN's quantile Huber loss (Dabney et al. 2018a), optionally with double Q.

  `rlax.quantile_q_learning` per example: the taken action's quantiles
  regress toward r + discount * the target quantiles of the greedy next
  action (by the mean of the quantiles; with `double_q` the online
  network's). New priorities are the per-example loss.

  Attributes:
    double_q: select the bootstrap action with the online network.
    huber_kappa: kappa of the quantile Huber loss (rlax's Huber, without the
      paper's division by kappa: the same for kappa 1); 0 is the plain
      quantile (absolute) loss.
  """
  double_q: bool = False
  huber_kappa: float = 1.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = default_weights_and_mask(batch, weights, mask)
    out_tm1 = apply_fn(online_params, batch.observation)
    out_t = apply_fn(target_params, batch.next_observation)
    selector = (apply_fn(online_params, batch.next_observation) if self.double_q else out_t)
    return _quantile_regression(out_tm1, out_t, selector, batch, weights, mask,
                                self.huber_kappa)


@dataclasses.dataclass(frozen=True)
class ImplicitQuantileLoss:
  """IQN's loss (Dabney et al. 2018b): quantile Huber regression at sampled fractions.

  The online network's quantiles at `num_taus` (N) sampled fractions of
  the taken action regress toward r + discount * the target network's
  quantiles at `num_target_taus` (N') fractions of the next action, which
  the mean of `num_policy_taus` (K) quantiles picks (the online network's
  with `double_q`). `rlax.quantile_q_learning` per example, with each
  example's own fractions. The network draws the fractions from its key
  (a stochastic network: the learner gives it one per step).

  Attributes:
    num_taus: N (64 in the paper).
    num_target_taus: N' (64).
    num_policy_taus: K (32).
    double_q: select the next action with the online network.
    huber_kappa: kappa of the quantile Huber loss (1 in the paper).
  """
  num_taus: int = 64
  num_target_taus: int = 64
  num_policy_taus: int = 32
  double_q: bool = False
  huber_kappa: float = 1.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = default_weights_and_mask(batch, weights, mask)
    out_tm1 = apply_fn(online_params, batch.observation, num_taus=self.num_taus)
    out_t = apply_fn(target_params, batch.next_observation, num_taus=self.num_target_taus)
    selector = apply_fn(online_params if self.double_q else target_params,
                        batch.next_observation, num_taus=self.num_policy_taus)
    return _quantile_regression(out_tm1, out_t, selector, batch, weights, mask,
                                self.huber_kappa)


@dataclasses.dataclass(frozen=True)
class MunchausenLoss:
  """Munchausen DQN (Vieillard et al. 2020): a scaled log-policy bonus and a soft bootstrap.

  With the target network's policy pi = softmax(q_target / tau):

    target = r + alpha * clip(tau * log pi(a|s), l0, 0)
               + discount * sum_a' pi(a'|s') (q_target(s', a') - tau * log pi(a'|s'))

  and the Huber (or squared) loss of target - q(s, a). With n-step
  transitions the bonus is the first action's and `r` the n-step return.

  Attributes:
    alpha: scale of the log-policy bonus (0.9 in the paper).
    tau: entropy temperature (0.03).
    clip_min: l0, the lower clip of the scaled log-policy tau * log pi (-1).
    huber_delta: Huber loss threshold; 0 gives the squared loss.
  """
  alpha: float = 0.9
  tau: float = 0.03
  clip_min: float = -1.0
  huber_delta: float = 1.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = default_weights_and_mask(batch, weights, mask)
    q_tm1 = apply_fn(online_params, batch.observation).q_values  # [B, A]
    q_t_target = apply_fn(target_params, batch.next_observation).q_values  # [B, A]
    bonus, pi_t, tau_log_pi_t = _munchausen_terms(
        apply_fn(target_params, batch.observation).q_values, q_t_target, batch.action,
        self.alpha, self.tau, self.clip_min)
    soft_value_t = jnp.sum(pi_t * (q_t_target - tau_log_pi_t), axis=-1)
    target = jax.lax.stop_gradient(batch.reward + bonus + batch.discount * soft_value_t)
    q_taken = jnp.take_along_axis(q_tm1, batch.action[:, None], axis=-1)[:, 0]
    loss, extras = _td_loss(target - q_taken, q_tm1, weights, mask, self.huber_delta)
    extras.metrics["munchausen_bonus_mean"] = jnp.sum(jax.lax.stop_gradient(bonus) * mask) / (
        jnp.maximum(jnp.sum(mask), 1.0))
    return loss, extras


@dataclasses.dataclass(frozen=True)
class MunchausenImplicitQuantileLoss:
  """M-IQN (Vieillard et al. 2020): IQN's quantile regression toward the Munchausen target.

  With the target network's Q-values from `num_policy_taus` (K) fractions
  and pi = softmax(q_target / tau), each of the `num_target_taus` (N')
  target quantiles theta'_j gives one target sample

    T_j = r + alpha * clip(tau * log pi(a|s), l0, 0)
            + discount * sum_a' pi(a'|s') (theta'_j(s', a') - tau * log pi(a'|s')),

  and the online quantiles of the taken action at `num_taus` (N) fractions
  regress on them by the quantile Huber loss (`rlax.quantile_regression_loss`).
  New priorities are the per-example loss.
  """
  num_taus: int = 64
  num_target_taus: int = 64
  num_policy_taus: int = 32
  alpha: float = 0.9
  tau: float = 0.03
  clip_min: float = -1.0
  huber_kappa: float = 1.0

  def __call__(self, apply_fn: ApplyFn, online_params: Params,
               target_params: Params, batch: Transition,
               weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras) for a batch of transitions."""
    chex.assert_rank(batch.action, 1)
    weights, mask = default_weights_and_mask(batch, weights, mask)
    out_tm1 = apply_fn(online_params, batch.observation, num_taus=self.num_taus)
    out_t = apply_fn(target_params, batch.next_observation, num_taus=self.num_target_taus)
    policy_q = lambda obs: apply_fn(target_params, obs, num_taus=self.num_policy_taus).q_values
    bonus, pi_t, tau_log_pi_t = _munchausen_terms(
        policy_q(batch.observation), policy_q(batch.next_observation), batch.action,
        self.alpha, self.tau, self.clip_min)
    soft_quantiles = jnp.sum(pi_t[:, :, None] * (
        out_t.quantiles - tau_log_pi_t[:, :, None]), axis=1)  # [B, N']
    targets = jax.lax.stop_gradient(
        (batch.reward + bonus)[:, None] + batch.discount[:, None] * soft_quantiles)
    taken = jnp.take_along_axis(out_tm1.quantiles, batch.action[:, None, None], axis=1)[:, 0]
    per_example = jax.vmap(rlax.quantile_regression_loss, in_axes=(0, 0, 0, None))(
        taken, out_tm1.taus, targets, self.huber_kappa)
    loss = _weighted_mean(per_example, weights, mask)
    td_error = jnp.mean(targets, axis=-1) - jax.lax.stop_gradient(jnp.mean(taken, axis=-1))
    metrics = _td_metrics(td_error, jax.lax.stop_gradient(out_tm1.q_values), mask)
    metrics["munchausen_bonus_mean"] = jnp.sum(bonus * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, LossExtras(td_error=td_error, priorities=jax.lax.stop_gradient(per_example),
                            metrics=metrics)


def _munchausen_terms(q_s, q_next, action, alpha: float, tau: float, clip_min: float):
  """(bonus [B], pi(.|s') [B, A], tau * log pi(.|s') [B, A]) of the target network's softmax policy.

  bonus = alpha * clip(tau * log pi(a|s), clip_min, 0), pi = softmax(q / tau).
  """
  log_pi_s = jax.nn.log_softmax(q_s / tau, axis=-1)
  log_pi_taken = jnp.take_along_axis(log_pi_s, action[:, None], axis=-1)[:, 0]
  bonus = alpha * jnp.clip(tau * log_pi_taken, clip_min, 0.0)
  log_pi_next = jax.nn.log_softmax(q_next / tau, axis=-1)
  return bonus, jnp.exp(log_pi_next), tau * log_pi_next


def _td_loss(td_error, q_tm1, weights, mask, huber_delta: float):
  """Huber (or squared, `huber_delta` 0) TD loss; priorities |TD error|, as every Q-value loss."""
  if huber_delta > 0:
    per_example = rlax.huber_loss(td_error, huber_delta)
  else:
    per_example = rlax.l2_loss(td_error)
  loss = _weighted_mean(per_example, weights, mask)
  td_error = jax.lax.stop_gradient(td_error)
  metrics = _td_metrics(td_error, jax.lax.stop_gradient(q_tm1), mask)
  return loss, LossExtras(td_error=td_error, priorities=jnp.abs(td_error), metrics=metrics)


def _quantile_regression(out_tm1: NetworkOutput, out_t: NetworkOutput,
                         selector: NetworkOutput, batch: Transition, weights, mask,
                         huber_kappa: float):
  """`rlax.quantile_q_learning` per example; priorities are the per-example losses.

  Fractions are shared ([N], QR-DQN) or per example ([B, N], IQN).
  """
  tau_axis = None if out_tm1.taus.ndim == 1 else 0
  # rlax takes quantiles as [N, A] per example.
  per_example = jax.vmap(rlax.quantile_q_learning,
                         in_axes=(0, tau_axis, 0, 0, 0, 0, 0, None))(
      jnp.swapaxes(out_tm1.quantiles, 1, 2), out_tm1.taus, batch.action, batch.reward,
      batch.discount, jnp.swapaxes(selector.quantiles, 1, 2),
      jnp.swapaxes(out_t.quantiles, 1, 2), huber_kappa)
  loss = _weighted_mean(per_example, weights, mask)
  td_error = _expected_td_error(out_tm1.q_values, out_t.q_values, selector.q_values, batch)
  metrics = _td_metrics(td_error, jax.lax.stop_gradient(out_tm1.q_values), mask)
  return loss, LossExtras(td_error=td_error,
                          priorities=jax.lax.stop_gradient(per_example), metrics=metrics)


def _expected_td_error(q_tm1, q_t_value, q_t_selector, batch: Transition) -> chex.Array:
  """TD error on expected Q-values (what distributional losses report, for comparison)."""
  q_tm1, q_t_value, q_t_selector = jax.lax.stop_gradient((q_tm1, q_t_value, q_t_selector))
  next_action = jnp.argmax(q_t_selector, axis=-1)
  bootstrap = jnp.take_along_axis(q_t_value, next_action[:, None], axis=-1)[:, 0]
  q_taken = jnp.take_along_axis(q_tm1, batch.action[:, None], axis=-1)[:, 0]
  return batch.reward + batch.discount * bootstrap - q_taken


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
