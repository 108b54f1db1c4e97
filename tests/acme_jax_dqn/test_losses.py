"""Losses against rlax's own functions, hand-computed cases and a brute-force C51 projection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from acme_jax_dqn import losses
from acme_jax_dqn.networks import NetworkOutput
from acme_jax_dqn.types import Transition

B, A, N = 16, 3, 7


def _batch(rng, obs_dim=5):
  return Transition(
      observation=rng.normal(size=(B, obs_dim)).astype(np.float32),
      action=rng.integers(0, A, size=B).astype(np.int32),
      reward=rng.normal(size=B).astype(np.float32),
      discount=rng.choice([0.0, 0.9, 0.99], size=B).astype(np.float32),
      next_observation=rng.normal(size=(B, obs_dim)).astype(np.float32))


def _linear_apply(params, observation):
  return NetworkOutput(q_values=observation @ params["w"])


def _params(rng, obs_dim=5):
  return {"w": jnp.asarray(rng.normal(size=(obs_dim, A)).astype(np.float32))}


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("huber_delta", [0.0, 1.0])
@pytest.mark.parametrize("use_jit", [False, True])
def test_q_loss_matches_rlax_per_example_with_weights_and_mask(double_q, huber_delta, use_jit):
  rng = np.random.default_rng(0)
  batch, online, target = _batch(rng), _params(rng), _params(rng)
  weights = rng.uniform(0.1, 1.0, size=B).astype(np.float32)
  mask = (rng.uniform(size=B) > 0.3).astype(np.float32)
  loss_fn = losses.QLearningLoss(double_q=double_q, huber_delta=huber_delta)
  call = jax.jit(loss_fn, static_argnums=0) if use_jit else loss_fn
  loss, extras = call(_linear_apply, online, target, batch, weights, mask)

  expected_terms, expected_td = [], []
  for i in range(B):  # One example at a time through rlax, as the reference.
    q_tm1 = batch.observation[i] @ online["w"]
    q_t_value = batch.next_observation[i] @ target["w"]
    if double_q:
      td = rlax.double_q_learning(q_tm1, batch.action[i], batch.reward[i], batch.discount[i],
                                  q_t_value, batch.next_observation[i] @ online["w"])
    else:
      td = rlax.q_learning(q_tm1, batch.action[i], batch.reward[i], batch.discount[i], q_t_value)
    term = rlax.huber_loss(td, huber_delta) if huber_delta else 0.5 * td ** 2
    expected_terms.append(weights[i] * mask[i] * term)
    expected_td.append(td)
  expected = np.sum(expected_terms) / np.sum(mask)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(extras.td_error, expected_td, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(extras.priorities, np.abs(expected_td), rtol=1e-5, atol=1e-6)


def test_q_loss_hand_computed_case():
  # q(s) = [1, 2], action 1, r = 1, discount 0.9, target q(s') = [3, 4]:
  # target 1 + 0.9 * 4 = 4.6, td 2.6; Huber(1) = 2.6 - 0.5, squared = 0.5 * 2.6**2.
  def apply(params, obs):
    return NetworkOutput(q_values=jnp.where(obs[:, :1] > 0, params["next"], params["now"]))
  params = {"now": jnp.array([1.0, 2.0]), "next": jnp.array([3.0, 4.0])}
  batch = Transition(np.array([[0.0]], np.float32), np.array([1], np.int32),
                     np.array([1.0], np.float32), np.array([0.9], np.float32),
                     np.array([[1.0]], np.float32))
  huber, _ = losses.QLearningLoss(huber_delta=1.0)(apply, params, params, batch)
  squared, extras = losses.QLearningLoss(huber_delta=0.0)(apply, params, params, batch)
  np.testing.assert_allclose(extras.td_error, [2.6], rtol=1e-6)
  np.testing.assert_allclose(huber, 2.1, rtol=1e-6)
  np.testing.assert_allclose(squared, 0.5 * 2.6 ** 2, rtol=1e-6)


def _project_numpy(atoms, probs, reward, discount):
  """Brute force: move each target atom's mass to its two neighbours on the support."""
  v_min, v_max = atoms[0], atoms[-1]
  dz = atoms[1] - atoms[0]
  out = np.zeros_like(atoms, dtype=np.float64)
  for z, p in zip(atoms, probs):
    tz = np.clip(reward + discount * z, v_min, v_max)
    b = (tz - v_min) / dz
    lower, upper = int(np.floor(b)), int(np.ceil(b))
    if lower == upper:
      out[lower] += p
    else:
      out[lower] += p * (upper - b)
      out[upper] += p * (b - lower)
  return out


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("use_jit", [False, True])
def test_categorical_loss_matches_brute_force_projection(double_q, use_jit):
  rng = np.random.default_rng(1)
  atoms = np.linspace(-3.0, 3.0, N).astype(np.float32)
  logits = {"online": rng.normal(size=(B, A, N)).astype(np.float32),
            "online_next": rng.normal(size=(B, A, N)).astype(np.float32),
            "target_next": rng.normal(size=(B, A, N)).astype(np.float32)}

  def apply(params, observation):
    # observation[:, 0] says which logits table (0 = now, 1 = next); rows are examples.
    table = jnp.where(observation[:, :1, None] > 0, params["next"], params["now"])
    q = jnp.sum(jax.nn.softmax(table, -1) * atoms, -1)
    return NetworkOutput(q_values=q, logits=table, atoms=jnp.asarray(atoms))

  online = {"now": logits["online"], "next": logits["online_next"]}
  target = {"now": logits["online"], "next": logits["target_next"]}
  batch = Transition(np.zeros((B, 1), np.float32), rng.integers(0, A, B).astype(np.int32),
                     rng.uniform(-2, 2, B).astype(np.float32),
                     rng.choice([0.0, 0.5, 0.9], B).astype(np.float32),
                     np.ones((B, 1), np.float32))
  loss_fn = losses.CategoricalLoss(double_q=double_q)
  call = jax.jit(loss_fn, static_argnums=0) if use_jit else loss_fn
  loss, extras = call(apply, online, target, batch)

  def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  expected, edge_mass = [], []
  for i in range(B):
    target_probs = softmax(logits["target_next"][i].astype(np.float64))  # [A, N]
    selector = softmax(logits["online_next"][i]) if double_q else target_probs
    next_action = np.argmax((selector * atoms).sum(-1))
    projected = _project_numpy(atoms, target_probs[next_action], batch.reward[i],
                               batch.discount[i])
    log_p = np.log(softmax(logits["online"][i][batch.action[i]].astype(np.float64)))
    expected.append(-(projected * log_p).sum())
    target_z = batch.reward[i] + batch.discount[i] * atoms  # Brute force: mass cut off.
    edge_mass.append(target_probs[next_action][(target_z < atoms[0]) | (target_z > atoms[-1])]
                     .sum())
  np.testing.assert_allclose(extras.priorities, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, np.mean(expected), rtol=1e-4)
  # The share of target mass whose target lies outside the support (cut to its edges).
  assert 0.05 < np.mean(edge_mass) < 0.95  # The random batch has some of both.
  np.testing.assert_allclose(extras.metrics["c51_clipped_mass"], np.mean(edge_mass), rtol=1e-4)


def test_clipped_mass_is_one_when_the_support_cannot_reach_the_returns():
  """Rewards of 50 on the support [-3, 3]: every target lands on the top atom."""
  atoms = jnp.linspace(-3.0, 3.0, N)

  def apply(params, observation):
    logits = jnp.broadcast_to(params["logits"], (observation.shape[0], A, N))
    return NetworkOutput(q_values=jnp.sum(jax.nn.softmax(logits) * atoms, -1),
                         logits=logits, atoms=atoms)

  params = {"logits": jnp.zeros((A, N))}
  rng = np.random.default_rng(2)
  batch = _batch(rng)._replace(reward=np.full(B, 50.0, np.float32))
  _, extras = losses.CategoricalLoss()(apply, params, params, batch)
  assert float(extras.metrics["c51_clipped_mass"]) == pytest.approx(1.0, abs=1e-6)
  _, fitting = losses.CategoricalLoss()(apply, params, params,
                                        batch._replace(reward=np.zeros(B, np.float32)))
  # Rewards 0 and discounts <= 0.99: every target stays inside [-3, 3].
  assert float(fitting.metrics["c51_clipped_mass"]) == 0.0


def _quantile_apply(params, observation):
  """A linear quantile network: [B, D] @ [D, A * N] -> quantiles [B, A, N] at fractions (2i+1)/2N."""
  quantiles = (observation @ params["w"]).reshape(observation.shape[0], A, N)
  taus = (jnp.arange(N) + 0.5) / N
  return NetworkOutput(q_values=quantiles.mean(-1), quantiles=quantiles, taus=taus)


def _quantile_huber_by_hand(theta, taus, targets, kappa):
  """Dabney et al. 2018a, eq. 10 (with rlax's Huber scale): sum_i mean_j rho_tau_i(T_j - theta_i)."""
  total = 0.0
  for i in range(len(theta)):
    for target in targets:
      u = target - theta[i]
      if kappa > 0:
        huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
      else:
        huber = abs(u)
      total += abs(taus[i] - (1.0 if u < 0 else 0.0)) * huber / len(targets)
  return total


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("kappa", [0.0, 1.0, 2.0])
def test_quantile_loss_is_the_papers_quantile_huber_loss_by_brute_force(double_q, kappa):
  rng = np.random.default_rng(3)
  batch = _batch(rng)
  online = {"w": jnp.asarray(rng.normal(size=(5, A * N)).astype(np.float32))}
  target = {"w": jnp.asarray(rng.normal(size=(5, A * N)).astype(np.float32))}
  weights = rng.uniform(0.1, 1.0, size=B).astype(np.float32)
  mask = (rng.uniform(size=B) > 0.3).astype(np.float32)
  loss, extras = jax.jit(losses.QuantileLoss(double_q=double_q, huber_kappa=kappa),
                         static_argnums=0)(_quantile_apply, online, target, batch, weights, mask)
  taus = (np.arange(N) + 0.5) / N
  terms = []
  for i in range(B):
    theta = (batch.observation[i] @ np.asarray(online["w"])).reshape(A, N)
    theta_t = (batch.next_observation[i] @ np.asarray(target["w"])).reshape(A, N)
    selector = (batch.next_observation[i] @ np.asarray(online["w"])).reshape(A, N) \
        if double_q else theta_t
    next_action = int(np.argmax(selector.mean(-1)))
    targets = batch.reward[i] + batch.discount[i] * theta_t[next_action]
    terms.append(_quantile_huber_by_hand(theta[batch.action[i]], taus, targets, kappa))
  terms = np.asarray(terms)
  np.testing.assert_allclose(extras.priorities, terms, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, np.sum(weights * mask * terms) / np.sum(mask), rtol=1e-4)


@pytest.mark.parametrize("huber_delta", [0.0, 1.0])
def test_munchausen_target_by_hand(huber_delta):
  """Vieillard et al. 2020, eq. 4, with the target network's softmax policy, element by element."""
  rng = np.random.default_rng(4)
  batch, online, target = _batch(rng), _params(rng), _params(rng)
  alpha, tau, l0 = 0.9, 0.03, -1.0
  loss_fn = losses.MunchausenLoss(alpha=alpha, tau=tau, clip_min=l0, huber_delta=huber_delta)
  loss, extras = jax.jit(loss_fn, static_argnums=0)(_linear_apply, online, target, batch)
  w_online, w_target = np.asarray(online["w"], np.float64), np.asarray(target["w"], np.float64)
  expected_td, terms = [], []
  for i in range(B):
    q_s_target = batch.observation[i] @ w_target
    q_next_target = batch.next_observation[i] @ w_target

    def log_policy(q):
      z = q / tau
      return z - (np.max(z) + np.log(np.sum(np.exp(z - np.max(z)))))

    bonus = alpha * min(max(tau * log_policy(q_s_target)[batch.action[i]], l0), 0.0)
    pi_next, log_pi_next = np.exp(log_policy(q_next_target)), log_policy(q_next_target)
    soft_value = sum(pi_next[b] * (q_next_target[b] - tau * log_pi_next[b]) for b in range(A))
    td = (batch.reward[i] + bonus + batch.discount[i] * soft_value
          - (batch.observation[i] @ w_online)[batch.action[i]])
    expected_td.append(td)
    terms.append(0.5 * td * td if huber_delta == 0 or abs(td) <= huber_delta
                 else huber_delta * (abs(td) - 0.5 * huber_delta))
  np.testing.assert_allclose(extras.td_error, expected_td, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(loss, np.mean(terms), rtol=1e-4)
  assert float(extras.metrics["munchausen_bonus_mean"]) <= 0.0  # tau log pi <= 0, clipped at l0.


def _iqn_apply(params, observation, num_taus):
  """A linear IQN stand-in: quantile(b, a, t) = obs_b . w_a + tau_bt * c_a, fractions seeded by N."""
  taus = jnp.asarray(np.random.default_rng(num_taus).uniform(
      size=(observation.shape[0], num_taus)).astype(np.float32))
  q = observation @ params["w"]  # [B, A]
  quantiles = q[:, :, None] + taus[:, None, :] * params["c"][None, :, None]  # [B, A, T]
  return NetworkOutput(q_values=quantiles.mean(-1), quantiles=quantiles, taus=taus)


@pytest.mark.parametrize("double_q", [False, True])
def test_iqn_loss_regresses_n_sampled_fractions_toward_n_prime_by_brute_force(double_q):
  rng = np.random.default_rng(5)
  batch = _batch(rng)
  make = lambda: {"w": jnp.asarray(rng.normal(size=(5, A)).astype(np.float32)),  # pylint: disable=unnecessary-lambda-assignment
                  "c": jnp.asarray(rng.uniform(0.5, 2.0, size=A).astype(np.float32))}
  online, target = make(), make()
  n, n_prime, k = 6, 5, 4
  loss_fn = losses.ImplicitQuantileLoss(num_taus=n, num_target_taus=n_prime,
                                        num_policy_taus=k, double_q=double_q, huber_kappa=1.0)
  apply_fn = lambda p, o, num_taus: _iqn_apply(p, o, num_taus)  # pylint: disable=unnecessary-lambda-assignment
  loss, extras = loss_fn(apply_fn, online, target, batch)
  taus = {t: np.random.default_rng(t).uniform(size=(B, t)).astype(np.float32) for t in (n, n_prime, k)}

  def quantiles(params, obs, i, count):
    q = obs @ np.asarray(params["w"])
    return q[:, None] + taus[count][i][None, :] * np.asarray(params["c"])[:, None]  # [A, T]

  terms = []
  for i in range(B):
    theta = quantiles(online, batch.observation[i], i, n)[batch.action[i]]
    selector = quantiles(online if double_q else target, batch.next_observation[i], i, k)
    next_action = int(np.argmax(selector.mean(-1)))
    targets = batch.reward[i] + batch.discount[i] * quantiles(
        target, batch.next_observation[i], i, n_prime)[next_action]
    terms.append(_quantile_huber_by_hand(theta, taus[n][i], targets, 1.0))
  np.testing.assert_allclose(extras.priorities, terms, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, np.mean(terms), rtol=1e-4)


@pytest.mark.parametrize("kappa", [0.0, 1.0])
def test_munchausen_iqn_target_samples_by_brute_force(kappa):
  """M-IQN: the Munchausen target per target fraction j, element by element, quantile Huber loss."""
  rng = np.random.default_rng(6)
  batch = _batch(rng)
  make = lambda: {"w": jnp.asarray(rng.normal(size=(5, A)).astype(np.float32)),  # pylint: disable=unnecessary-lambda-assignment
                  "c": jnp.asarray(rng.uniform(0.5, 2.0, size=A).astype(np.float32))}
  online, target = make(), make()
  n, n_prime, k, alpha, tau, l0 = 6, 5, 4, 0.9, 0.03, -1.0
  loss_fn = losses.MunchausenImplicitQuantileLoss(
      num_taus=n, num_target_taus=n_prime, num_policy_taus=k, alpha=alpha, tau=tau,
      clip_min=l0, huber_kappa=kappa)
  apply_fn = lambda p, o, num_taus: _iqn_apply(p, o, num_taus)  # pylint: disable=unnecessary-lambda-assignment
  loss, extras = loss_fn(apply_fn, online, target, batch)
  taus = {t: np.random.default_rng(t).uniform(size=(B, t)).astype(np.float64) for t in (n, n_prime, k)}

  def quantiles(params, obs, i, count):  # [A, count]
    q = obs @ np.asarray(params["w"], np.float64)
    return q[:, None] + taus[count][i][None, :] * np.asarray(params["c"], np.float64)[:, None]

  def log_policy(q):
    z = q / tau
    return z - (np.max(z) + np.log(np.sum(np.exp(z - np.max(z)))))

  terms, clipped = [], 0
  for i in range(B):
    theta = quantiles(online, batch.observation[i], i, n)[batch.action[i]]
    scaled = tau * log_policy(quantiles(target, batch.observation[i], i, k).mean(-1))[
        batch.action[i]]
    clipped += scaled < l0
    bonus = alpha * min(max(scaled, l0), 0.0)
    log_pi_next = log_policy(quantiles(target, batch.next_observation[i], i, k).mean(-1))
    theta_next = quantiles(target, batch.next_observation[i], i, n_prime)  # [A, N']
    targets = [batch.reward[i] + bonus + batch.discount[i] * sum(
        np.exp(log_pi_next[a]) * (theta_next[a, j] - tau * log_pi_next[a]) for a in range(A))
               for j in range(n_prime)]
    terms.append(_quantile_huber_by_hand(theta, taus[n][i], targets, kappa))
  assert clipped > 0  # The batch reaches the clip at l0.
  np.testing.assert_allclose(extras.priorities, terms, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, np.mean(terms), rtol=1e-4)
