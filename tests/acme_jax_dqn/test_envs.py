"""Environment adapters and loops: termination vs truncation, batched auto-reset, names."""

import dm_env
import gymnasium as gym
import numpy as np
import pytest

from acme_jax_dqn import envs, specs, xla_setup
from acme_jax_dqn.envs import batched
from acme_jax_dqn.envs.gymnasium_adapter import GymnasiumEnvironment
from acme_jax_dqn.environment_loop import EnvironmentLoop
from tests.fakes import FakeEnvironment


def test_gymnasium_truncation_keeps_discount_one():
  env = GymnasiumEnvironment(gym.make("CartPole-v1", max_episode_steps=3), seed=0)
  ts = env.reset()
  assert ts.first()
  for _ in range(3):
    ts = env.step(0 if ts.observation[2] > 0 else 1)  # Balance for 3 steps.
  assert ts.last() and ts.discount == 1.0


def test_gymnasium_termination_has_discount_zero():
  env = envs.make_environment("gymnasium:CartPole-v1", seed=0)
  ts = env.reset()
  while not ts.last():
    ts = env.step(1)  # Always push right: the pole falls.
  assert ts.discount == 0.0 and ts.reward == 1.0


def test_spec_of_cartpole():
  spec = specs.make_environment_spec(envs.make_environment("gymnasium:CartPole-v1"))
  assert spec.observations.shape == (4,) and spec.actions.num_values == 2


def test_batched_environment_resets_the_dm_env_way():
  env = envs.BatchedEnvironment(lambda i: FakeEnvironment(episode_length=2 + i), num_envs=2)
  ts = env.reset()
  assert list(ts.step_type) == [dm_env.StepType.FIRST] * 2
  ts = env.step([0, 0])
  ts = env.step([0, 0])
  assert list(ts.step_type) == [dm_env.StepType.LAST, dm_env.StepType.MID]
  ts = env.step([0, 0])
  assert list(ts.step_type) == [dm_env.StepType.FIRST, dm_env.StepType.LAST]
  assert ts.observation[0, 0] == 0.0 and ts.reward[0] == 0.0


@pytest.mark.parametrize("name", ["CartPole-v1", "gym:CartPole-v1", "gymnasium:NoSuchEnv-v0"])
def test_unknown_environment_names_list_the_known_prefixes(name):
  with pytest.raises(ValueError, match="gymnasium"):
    envs.make_environment(name)


def test_a_gymnax_environment_whose_data_cannot_be_fetched_is_one_value_error(monkeypatch):
  """gymnax's MNISTBandit-bsuite downloads MNIST as it is made: offline, a ValueError naming
  the environment and the way out (a run prints it as one line), not urllib's traceback."""
  import urllib.error  # pylint: disable=import-outside-toplevel
  import gymnax  # pylint: disable=import-outside-toplevel

  def offline(env_id, **kwargs):
    raise urllib.error.URLError("[Errno -2] Name or service not known")
  monkeypatch.setattr(gymnax, "make", offline)
  for make in (envs.make_jax_environment, envs.make_environment):
    with pytest.raises(ValueError, match=r"gymnax could not make 'MNISTBandit-bsuite': .*"
                       r"Name or service not known.*reach the internet, or pick another"):
      make("gymnax:MNISTBandit-bsuite")


def test_environment_loop_counts_steps_and_episodes():
  class Actor:
    def select_action(self, observation):
      return 0
    def observe_first(self, timestep):
      pass
    def observe(self, action, next_timestep):
      pass
    def update(self, wait=False):
      pass

  loop = EnvironmentLoop(FakeEnvironment(episode_length=4), Actor())
  result = loop.run_episode()
  assert result["episode_length"] == 4 and result["episode_return"] == 4.0
  assert loop.run(num_episodes=2) == 8
  finished = loop.run_steps(10)
  assert [e["episode_length"] for e in finished] == [4, 4]
  assert loop.counter.get_counts()["steps"] == 4 + 8 + 10

  steps = iter(range(100))  # Stops after the second step: nothing is counted.
  assert loop.run_episode(should_stop=lambda: next(steps) >= 1) is None
  assert loop.counter.get_counts() == {"episodes": 5, "steps": 22}
  assert loop.run_episode(should_stop=lambda: False)["episode_length"] == 4

  batched = EnvironmentLoop(envs.BatchedEnvironment(lambda i: FakeEnvironment(3), 2),
                            type("A", (Actor,), {"select_action": lambda s, o: np.zeros(2, int)})())
  finished = batched.run_steps(8)  # 4 batched steps: both copies end at step 3.
  assert [e["episode_return"] for e in finished] == [3.0, 3.0]


def test_copies_beyond_the_host_memory_are_refused_naming_a_count_that_fits(monkeypatch):
  with pytest.raises(ValueError, match=r"`num_envs`=10: .* Use `num_envs` <= 9\.$"):
    batched.check_copies_fit(10, 100, limit=1000)  # 0.9 of 1000 bytes: 9 copies of 100.
  batched.check_copies_fit(9, 100, limit=1000)  # Fits.
  made, closed = [], []

  class Copy(FakeEnvironment):
    def close(self):
      closed.append(self)

  def make(index):
    made.append(index)
    return Copy(episode_length=3)

  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 1)
  with pytest.raises(ValueError, match="`num_envs`=1000000"):
    envs.BatchedEnvironment(make, 1_000_000)
  assert made == [0, 1, 2] and len(closed) == 3  # Refused after the third copy, all closed.
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**30)
  assert envs.BatchedEnvironment(make, 3).copy_bytes > 0
