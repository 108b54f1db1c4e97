"""The n-step adder: exact transitions at terminations, truncations and auto-resets."""

import dm_env
import numpy as np
import pytest

from acme_jax_dqn.adders import NStepTransitionAdder
from acme_jax_dqn.types import Transition

GAMMA = 0.5
F, M, L = dm_env.StepType.FIRST, dm_env.StepType.MID, dm_env.StepType.LAST


class Sink:
  def __init__(self):
    self.items = []

  def __call__(self, transitions: Transition):
    for i in range(len(transitions.action)):
      self.items.append(tuple(float(np.ravel(x[i])[0]) for x in transitions))


def _ts(step_type, reward, discount, obs):
  return dm_env.TimeStep(np.array([step_type]), np.array([reward], np.float32),
                         np.array([discount], np.float32), np.array([[obs]], np.float32))


def _episode(adder, last_discount):
  adder.add_first(_ts(F, 0.0, 1.0, 0.0))
  for t, reward in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
    last = t == 4
    adder.add(np.array([10 + t - 1]), _ts(L if last else M, reward,
                                          last_discount if last else 1.0, float(t)))


@pytest.mark.parametrize("last_discount", [0.0, 1.0])
def test_two_step_returns_by_hand(last_discount):
  sink = Sink()
  _episode(NStepTransitionAdder(sink, n_step=2, discount=GAMMA, num_envs=1), last_discount)
  term = last_discount == 0.0
  # (observation, action, reward, discount, next_observation)
  expected = [
      (0.0, 10.0, 1 + GAMMA * 2, GAMMA ** 2, 2.0),
      (1.0, 11.0, 2 + GAMMA * 3, GAMMA ** 2, 3.0),
      (2.0, 12.0, 3 + GAMMA * 4, 0.0 if term else GAMMA ** 2, 4.0),
      (3.0, 13.0, 4.0, 0.0 if term else GAMMA, 4.0),
  ]
  # One array comparison: pytest 9.2's approx no longer takes nested sequences.
  np.testing.assert_allclose(np.asarray(sink.items), np.asarray(expected), rtol=1e-6)


@pytest.mark.parametrize("last_discount", [0.0, 1.0])
def test_one_step_transitions(last_discount):
  sink = Sink()
  _episode(NStepTransitionAdder(sink, n_step=1, discount=GAMMA, num_envs=1), last_discount)
  assert len(sink.items) == 4
  assert sink.items[0] == pytest.approx((0.0, 10.0, 1.0, GAMMA, 1.0))
  assert sink.items[-1] == pytest.approx((3.0, 13.0, 4.0, GAMMA * last_discount, 4.0))


def test_n_longer_than_episode_writes_every_suffix():
  sink = Sink()
  _episode(NStepTransitionAdder(sink, n_step=10, discount=GAMMA, num_envs=1), 0.0)
  assert [item[0] for item in sink.items] == [0.0, 1.0, 2.0, 3.0]
  assert sink.items[0][2] == pytest.approx(1 + GAMMA * 2 + GAMMA ** 2 * 3 + GAMMA ** 3 * 4)
  assert all(item[3] == 0.0 and item[4] == 4.0 for item in sink.items)


@pytest.mark.parametrize("n_step", [1, 3])
def test_batched_auto_reset_ignores_the_restart_step(n_step):
  """Env 0 ends and restarts while env 1 runs on; nothing crosses the episode boundary."""
  sink = Sink()
  adder = NStepTransitionAdder(sink, n_step=n_step, discount=GAMMA, num_envs=2)
  batch = lambda st, r, d, o: dm_env.TimeStep(np.array(st), np.array(r, np.float32),
                                               np.array(d, np.float32),
                                               np.array(o, np.float32)[:, None])
  adder.add_first(batch([F, F], [0, 0], [1, 1], [0, 100]))
  adder.add(np.array([1, 2]), batch([L, M], [1, 1], [0, 1], [1, 101]))
  adder.add(np.array([9, 3]), batch([F, M], [0, 1], [1, 1], [50, 102]))  # env 0 restarts.
  adder.add(np.array([4, 5]), batch([M, L], [1, 1], [1, 1], [51, 103]))
  starts = sorted(item[0] for item in sink.items)
  assert 50.0 not in [item[4] for item in sink.items if item[0] < 50]  # No crossing.
  assert 9.0 not in [item[1] for item in sink.items]  # The restart action is dropped.
  # n=1 writes env 0's new episode (from 50) at once; n=3 still holds it in its window.
  assert starts == ([0.0, 50.0, 100.0, 101.0, 102.0] if n_step == 1 else [0.0, 100.0, 101.0, 102.0])


@pytest.mark.parametrize("num_envs", [1, 2])
def test_reward_clip_acts_on_each_reward_before_the_three_step_sum(num_envs):
  """Rewards 3, -4, 0.5, 2 with c = 1: each is clipped, then summed (not the sum clipped)."""
  sink = Sink()
  adder = NStepTransitionAdder(sink, n_step=3, discount=GAMMA, num_envs=num_envs, reward_clip=1.0)
  rewards = [3.0, -4.0, 0.5, 2.0]

  def ts(step_type, reward, discount, obs):
    return dm_env.TimeStep(np.full(num_envs, step_type), np.full(num_envs, reward, np.float32),
                           np.full(num_envs, discount, np.float32),
                           np.full((num_envs, 1), obs, np.float32))

  adder.add_first(ts(F, 0.0, 1.0, 0.0))
  for t, reward in enumerate(rewards, start=1):
    adder.add(np.full(num_envs, t), ts(L if t == 4 else M, reward, 0.0 if t == 4 else 1.0,
                                       float(t)))
  clipped = [1.0, -1.0, 0.5, 1.0]
  expected = [  # (first observation, discounted sum of clipped rewards, bootstrap multiplier)
      (0.0, clipped[0] + GAMMA * clipped[1] + GAMMA ** 2 * clipped[2], GAMMA ** 3),
      (1.0, clipped[1] + GAMMA * clipped[2] + GAMMA ** 2 * clipped[3], 0.0),
      (2.0, clipped[2] + GAMMA * clipped[3], 0.0),
      (3.0, clipped[3], 0.0)]
  got = sorted({(item[0], item[2], item[3]) for item in sink.items})
  assert len(sink.items) == 4 * num_envs
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert 1.0 + GAMMA * -1.0 + GAMMA ** 2 * 0.5 != pytest.approx(
      float(np.clip(3.0 - 4.0 * GAMMA + 0.5 * GAMMA ** 2, -1, 1)))  # The old rule differs.
