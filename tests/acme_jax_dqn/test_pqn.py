"""PQN: Q(lambda) returns against the forward view by brute force, its loss, update and host side."""

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import learning
from acme_jax_dqn import losses
from acme_jax_dqn import pqn
from acme_jax_dqn.networks import NetworkOutput, Networks
from agents.dqn import ConfigError, DQNConfig


def forward_view_lambda_return(reward, env_discount, end, next_value, gamma, lam, t):
  """G^lambda_t from the definition: (1 - lam) sum_n lam^(n-1) G^(n)_t, the rest on the last G^(h).

  G^(n)_t sums n rewards and bootstraps from the value after the n-th step,
  times its env discount. The horizon h stops at the first episode end or the
  rollout's end, so no n-step return crosses an episode end.
  """
  T = len(reward)
  h = 1
  while t + h - 1 < T - 1 and not end[t + h - 1]:
    h += 1

  def n_step(n):
    total, multiplier = 0.0, 1.0
    for k in range(n):
      total += multiplier * reward[t + k]
      multiplier *= gamma * env_discount[t + k]
    return total + multiplier * next_value[t + n - 1]

  weights = [(1 - lam) * lam ** (n - 1) for n in range(1, h)] + [lam ** (h - 1)]
  return sum(w * n_step(n) for w, n in zip(weights, range(1, h + 1)))


def test_q_lambda_returns_equal_the_forward_view_on_a_stream_with_a_termination_and_a_truncation():
  rng = np.random.default_rng(0)
  T, E, gamma, lam = 9, 3, 0.9, 0.7
  reward = rng.normal(size=(T, E)).astype(np.float32)
  next_value = rng.normal(size=(T, E)).astype(np.float32)
  env_discount = np.ones((T, E), np.float32)
  end = np.zeros((T, E), np.float32)
  env_discount[2, 0], end[2, 0] = 0.0, 1.0  # Copy 0: a termination at step 2 ...
  end[6, 0] = 1.0  # ... and a truncation (env discount 1) at step 6.
  end[4, 1] = 1.0  # Copy 1: a truncation only; copy 2: no episode end.
  got = np.asarray(pqn.q_lambda_returns(jnp.asarray(reward), jnp.asarray(gamma * env_discount),
                                        jnp.asarray(end), jnp.asarray(next_value), lam))
  want = np.array([[forward_view_lambda_return(reward[:, e], env_discount[:, e], end[:, e],
                                               next_value[:, e], gamma, lam, t)
                    for e in range(E)] for t in range(T)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_q_lambda_returns_by_hand():
  """r = 1, 2, 3, 4; a termination after step 1, a truncation after step 3 (the last)."""
  gamma, lam = 0.5, 0.5
  reward = jnp.array([[1.0], [2.0], [3.0], [4.0]])
  env_discount = jnp.array([[1.0], [0.0], [1.0], [1.0]])
  end = jnp.array([[0.0], [1.0], [0.0], [1.0]])
  v = jnp.array([[10.0], [20.0], [30.0], [40.0]])  # max_a Q at each step's next observation.
  got = np.asarray(pqn.q_lambda_returns(reward, gamma * env_discount, end, v, lam))[:, 0]
  g1 = 2.0  # Terminated: no bootstrap.
  g0 = 1.0 + 0.5 * (0.5 * 10.0 + 0.5 * g1)  # 4.0
  g3 = 4.0 + 0.5 * 40.0  # Truncated: bootstraps from the final observation's value.
  g2 = 3.0 + 0.5 * (0.5 * 30.0 + 0.5 * g3)  # 16.5
  np.testing.assert_allclose(got, [g0, g1, g2, g3])
  assert (g0, g2, g3) == (4.0, 16.5, 24.0)


def _linear_networks(num_actions=2, obs_dim=3):
  """Q = obs @ W: a stand-in network whose Q-values a test can compute with NumPy."""
  def init(key):
    return {"w": jax.random.normal(key, (obs_dim, num_actions))}

  def apply(params, observation, noise_key=None):
    del noise_key
    q = observation @ params["w"]
    return NetworkOutput(q_values=q)
  return Networks(init=init, apply=apply, num_actions=num_actions, distributional=False)


def test_return_regression_loss_is_half_the_mean_squared_error_over_unmasked_items():
  networks = _linear_networks()
  params = networks.init(jax.random.PRNGKey(1))
  rng = np.random.default_rng(1)
  batch = pqn.ReturnTarget(observation=rng.normal(size=(5, 3)).astype(np.float32),
                           action=np.array([0, 1, 1, 0, 1], np.int32),
                           target_return=rng.normal(size=5).astype(np.float32))
  mask = np.array([1, 1, 0, 1, 1], np.float32)
  loss, extras = losses.ReturnRegressionLoss(huber_delta=0.0)(
      networks.apply, params, (), batch, None, mask)
  q = batch.observation @ np.asarray(params["w"])
  td = batch.target_return - q[np.arange(5), batch.action]
  np.testing.assert_allclose(loss, np.sum(0.5 * td ** 2 * mask) / 4, rtol=1e-5)
  np.testing.assert_allclose(extras.td_error, td, rtol=1e-5)


def _rollout(rng, T, E, obs_dim=3):
  obs = rng.normal(size=(T, E, obs_dim)).astype(np.float32)
  return pqn.RolloutStep(
      observation=obs, action=rng.integers(0, 2, size=(T, E)).astype(np.int32),
      reward=rng.normal(size=(T, E)).astype(np.float32),
      env_discount=np.ones((T, E), np.float32), end=np.zeros((T, E), np.float32),
      next_observation=rng.normal(size=(T, E, obs_dim)).astype(np.float32),
      valid=np.ones((T, E), np.float32))


def _update(networks, epochs, minibatches, lr=0.1):
  optimizer = learning.make_optimizer(lr, max_grad_norm=0.0)
  sgd_step = learning.make_sgd_step(networks, losses.ReturnRegressionLoss(0.0), optimizer, 0, 1.0)
  update = pqn.make_rollout_update(networks, sgd_step, 0.9, 0.5, epochs, minibatches)
  state = learning.init_training_state(networks, optimizer, jax.random.PRNGKey(0),
                                       target_network=False)
  return jax.jit(update), state


def test_one_update_takes_epochs_times_minibatches_sgd_steps_without_a_target_network():
  networks = _linear_networks()
  update, state = _update(networks, epochs=3, minibatches=4)
  rollout = _rollout(np.random.default_rng(2), T=8, E=2)
  new_state, _, metrics = update(state, rollout)
  assert int(new_state.steps) == 12 and new_state.target_params == ()
  assert not np.allclose(new_state.online_params["w"], state.online_params["w"])
  # The targets come from the parameters before the update: lambda returns by brute force.
  v = np.max(rollout.next_observation @ np.asarray(state.online_params["w"]), axis=-1)
  want = [forward_view_lambda_return(rollout.reward[:, e], rollout.env_discount[:, e],
                                     rollout.end[:, e], v[:, e], 0.9, 0.5, t)
          for t in range(8) for e in range(2)]
  np.testing.assert_allclose(metrics["lambda_return_mean"], np.mean(want), rtol=1e-5)


def test_one_minibatch_one_epoch_is_one_sgd_step_on_the_whole_rollout():
  """With one minibatch the shuffle does not matter: the update is one Adam step on the full loss."""
  networks = _linear_networks()
  update, state = _update(networks, epochs=1, minibatches=1, lr=0.01)
  rollout = _rollout(np.random.default_rng(3), T=4, E=2)
  new_state, _, _ = update(state, rollout)
  w = np.asarray(state.online_params["w"], np.float64)
  v = np.max(rollout.next_observation @ w, axis=-1)
  targets = np.array([[forward_view_lambda_return(rollout.reward[:, e], rollout.env_discount[:, e],
                                                  rollout.end[:, e], v[:, e], 0.9, 0.5, t)
                       for e in range(2)] for t in range(4)]).reshape(-1)
  obs, action = rollout.observation.reshape(8, 3), rollout.action.reshape(8)
  td = targets - (obs @ w)[np.arange(8), action]
  grad = np.zeros_like(w)
  for i in range(8):
    grad[:, action[i]] -= td[i] * obs[i] / 8
  # Adam's first step moves each weight by lr * g / (|g| + eps).
  want = w - 0.01 * grad / (np.abs(grad) + 1e-8)
  np.testing.assert_allclose(new_state.online_params["w"], want, rtol=1e-4, atol=1e-6)


def test_invalid_steps_weigh_nothing():
  """A restart step (valid 0, after an episode's last step) changes nothing, whatever it holds."""
  networks = _linear_networks()
  update, state = _update(networks, epochs=2, minibatches=2)
  rollout = _rollout(np.random.default_rng(4), T=4, E=2)
  valid, end = np.ones((4, 2), np.float32), np.zeros((4, 2), np.float32)
  valid[1, 0] = 0.0
  end[0, 0] = end[1, 0] = 1.0  # As the adder writes them: LAST, then the restart.
  rollout = rollout._replace(valid=valid, end=end)
  reward, action = rollout.reward.copy(), rollout.action.copy()
  reward[1, 0] += 100.0
  action[1, 0] = 1 - action[1, 0]
  a, _, _ = update(state, rollout)
  b, _, _ = update(state, rollout._replace(reward=reward, action=action))
  np.testing.assert_allclose(a.online_params["w"], b.online_params["w"], rtol=1e-6)
  c, _, _ = update(state, rollout._replace(valid=np.ones((4, 2), np.float32)))
  assert not np.allclose(a.online_params["w"], c.online_params["w"])


def _timestep(step_type, reward, discount, observation):
  return dm_env.TimeStep(np.asarray(step_type), np.asarray(reward, np.float32),
                         np.asarray(discount, np.float32), np.asarray(observation, np.float32))


def test_rollout_adder_marks_restart_steps_and_the_buffer_hands_out_whole_rollouts():
  first, mid, last = (int(dm_env.StepType.FIRST), int(dm_env.StepType.MID),
                      int(dm_env.StepType.LAST))
  example = pqn.RolloutStep(np.zeros((2, 1), np.float32), np.zeros(2, np.int32),
                            *[np.zeros(2, np.float32)] * 3, np.zeros((2, 1), np.float32),
                            np.zeros(2, np.float32))
  buffer = pqn.RolloutBuffer(example, rollout_len=2)
  adder = pqn.RolloutAdder(buffer.insert, num_envs=2, reward_clip=1.0)
  adder.add_first(_timestep([first, first], [0, 0], [1, 1], [[0], [10]]))
  adder.add([0, 1], _timestep([last, mid], [5, -0.5], [0, 1], [[1], [11]]))
  assert buffer.pending_chunks == 0 and buffer.num_inserted == 0
  adder.add([1, 1], _timestep([first, last], [0, 1], [1, 1], [[2], [12]]))
  assert buffer.pending_chunks == 1 and buffer.num_inserted == 4
  rollout = buffer.pop_chunk()
  np.testing.assert_array_equal(rollout.observation[:, :, 0], [[0, 10], [1, 11]])
  np.testing.assert_array_equal(rollout.next_observation[:, :, 0], [[1, 11], [2, 12]])
  np.testing.assert_array_equal(rollout.reward, [[1.0, -0.5], [0.0, 1.0]])  # Clipped.
  np.testing.assert_array_equal(rollout.env_discount, [[0, 1], [0, 1]])  # Truncation keeps 1.
  np.testing.assert_array_equal(rollout.end, [[1, 0], [1, 1]])
  np.testing.assert_array_equal(rollout.valid, [[1, 1], [0, 1]])  # Copy 0 restarted.
  assert buffer.num_inserted == 4 and buffer.pending_chunks == 0


def test_a_restart_without_a_first_step_ends_the_episode_at_the_last_staged_step():
  """A resume that starts new episodes (environments not saved): no return reaches across."""
  first, mid = int(dm_env.StepType.FIRST), int(dm_env.StepType.MID)
  example = pqn.RolloutStep(np.zeros((2, 1), np.float32), np.zeros(2, np.int32),
                            *[np.zeros(2, np.float32)] * 3, np.zeros((2, 1), np.float32),
                            np.zeros(2, np.float32))
  buffer = pqn.RolloutBuffer(example, rollout_len=3)
  adder = pqn.RolloutAdder(buffer.insert, num_envs=2, on_restart=buffer.cut)
  adder.add_first(_timestep([first, first], [0, 0], [1, 1], [[0], [10]]))
  adder.add([0, 1], _timestep([mid, mid], [1, 1], [1, 1], [[1], [11]]))
  adder.add_first(_timestep([first, first], [0, 0], [1, 1], [[5], [15]]))  # New episodes.
  adder.add([0, 0], _timestep([mid, mid], [1, 1], [1, 1], [[6], [16]]))
  adder.add([1, 1], _timestep([mid, mid], [1, 1], [1, 1], [[7], [17]]))
  rollout = buffer.pop_chunk()
  np.testing.assert_array_equal(rollout.end, [[1, 1], [0, 0], [0, 0]])
  np.testing.assert_array_equal(rollout.env_discount, [[1, 1], [1, 1], [1, 1]])  # Truncated.
  np.testing.assert_array_equal(rollout.observation[:, :, 0], [[0, 10], [5, 15], [6, 16]])


@pytest.mark.parametrize("flags, field", [
    (dict(prioritized=True), "prioritized"), (dict(double_q=True), "double_q"),
    (dict(distributional=True), "distributional"), (dict(iqn=True), "iqn"),
    (dict(noisy=True), "noisy"), (dict(munchausen=True), "munchausen"),
    (dict(n_step=3), "n_step"), (dict(num_envs=3, pqn_rollout_len=5), "pqn_minibatches"),
])
def test_what_pqn_cannot_take_is_refused_naming_the_flag(flags, field):
  with pytest.raises(ConfigError, match=f"^`{field}`="):
    DQNConfig(pqn=True, **flags)
