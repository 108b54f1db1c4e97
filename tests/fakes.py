"""Shared test fakes: a dm_env environment with a known spec, fixed networks, damaged
checkpoints, and the repository paths."""

import glob
import os
import shutil

import dm_env
from dm_env import specs
import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn.networks import Networks, NetworkOutput

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The repository.
TINY = os.path.join("tests", "configs", "tiny.cfg")  # A flagfile for runs of seconds.


def copy_run(logdir, tmp_path):
  """A copy of a run's logdir (and checkpoints) under `tmp_path`, for tests that change it."""
  copy = tmp_path / "run"
  shutil.copytree(logdir, copy)
  return copy


def damage_checkpoints(checkpoint_dir, step="*"):
  """Cuts the array files of the checkpoints in `checkpoint_dir` (`step`: one of them) short,
  as a disk that lost them would."""
  data = glob.glob(os.path.join(str(checkpoint_dir), str(step), "state", "**", "d", "*"),
                   recursive=True)
  assert data
  for path in data:
    with open(path, "wb") as f:
      f.write(b"cut off")


class FakeEnvironment(dm_env.Environment):
  """Observations are the step index as a vector; episodes last `episode_length` steps.

  Rewards are `rewards[t]` for the t-th step (default 1). The last step is a
  termination (discount 0) or, with `truncate=True`, a truncation (discount 1).
  """

  def __init__(self, episode_length=4, num_actions=3, obs_dim=2, rewards=None,
               truncate=False, obs_shape=None, continuous=False):
    self._length = episode_length
    self._num_actions = num_actions
    self._obs_shape = obs_shape or (obs_dim,)
    self._rewards = rewards
    self._truncate = truncate
    self._continuous = continuous
    self._t = 0
    self.actions_taken = []

  def _observation(self):
    return np.full(self._obs_shape, self._t, np.float32)

  def reset(self):
    self._t = 0
    return dm_env.restart(self._observation())

  def step(self, action):
    self.actions_taken.append(action)
    reward = 1.0 if self._rewards is None else float(self._rewards[self._t])
    self._t += 1
    if self._t >= self._length:
      if self._truncate:
        return dm_env.truncation(reward, self._observation())
      return dm_env.termination(reward, self._observation())
    return dm_env.transition(reward, self._observation())

  def observation_spec(self):
    return specs.Array(self._obs_shape, np.float32, name="observation")

  def action_spec(self):
    if self._continuous:
      return specs.BoundedArray((1,), np.float32, -1.0, 1.0, name="action")
    return specs.DiscreteArray(self._num_actions, dtype=np.int32, name="action")


def fixed_networks(q_values, num_actions=None):
  """A network whose Q-values are `q_values` ([A]) for every observation.

  Params are a dict with the Q-values, so tests know the greedy action in
  advance (Dopamine's test-network idea).
  """
  q_values = jnp.asarray(q_values, jnp.float32)
  num_actions = num_actions or q_values.shape[-1]

  def init(key):
    del key
    return {"q": q_values}

  def apply(params, observation):
    batch = observation.shape[0]
    return NetworkOutput(q_values=jnp.broadcast_to(params["q"], (batch, num_actions)))

  return Networks(init=init, apply=apply, num_actions=num_actions, distributional=False)


class NaNRewardCartPole(CartPoleEnv):
  """CartPole whose `nan_at_step`-th step (counted over all episodes) returns reward NaN.

  Registered as `NaNRewardCartPole-v0`; runs name it
  `--env=gymnasium:tests.fakes:NaNRewardCartPole-v0`.
  """

  def __init__(self, nan_at_step: int = 700, **kwargs):
    super().__init__(**kwargs)
    self._nan_at_step = nan_at_step
    self._steps = 0

  def step(self, action):
    observation, reward, terminated, truncated, info = super().step(action)
    self._steps += 1
    if self._steps == self._nan_at_step:
      reward = float("nan")
    return observation, reward, terminated, truncated, info


if "NaNRewardCartPole-v0" not in gym.registry:
  gym.register(id="NaNRewardCartPole-v0", entry_point=NaNRewardCartPole,
               max_episode_steps=500)


class CartPoleRefusedInRay(CartPoleEnv):
  """CartPole that a Ray actor cannot make, as if its host held too little for the env copies.

  Its constructor raises the refusal such a host gives: with `on_restart`,
  only in an actor Ray restarted after a crash, else in any actor; outside
  Ray actors it is CartPole. Runs name it
  `--env=gymnasium:tests.fakes:CartPoleRefusedInRay-v0` (any actor) or
  `...:CartPoleRefusedOnRestart-v0` (restarted actors).
  """

  def __init__(self, on_restart: bool = False, **kwargs):
    import ray  # pylint: disable=import-outside-toplevel
    context = ray.get_runtime_context() if ray.is_initialized() else None
    if context is not None and context.get_actor_id() and (
        context.was_current_actor_reconstructed or not on_restart):
      raise ValueError("`num_envs`=1: this host cannot hold the copies. Use another host.")
    super().__init__(**kwargs)


for _name, _on_restart in (("CartPoleRefusedInRay-v0", False),
                           ("CartPoleRefusedOnRestart-v0", True)):
  if _name not in gym.registry:
    gym.register(id=_name, entry_point=CartPoleRefusedInRay, max_episode_steps=500,
                 kwargs={"on_restart": _on_restart})


class CartPoleCrashingTheEvaluator(CartPoleEnv):
  """CartPole whose first reset in a Ray evaluator node's first process ends that process.

  Registered as `CartPoleCrashingTheEvaluator-v0`; runs name it
  `--env=gymnasium:tests.fakes:CartPoleCrashingTheEvaluator-v0`.
  """

  def reset(self, **kwargs):
    import ray  # pylint: disable=import-outside-toplevel
    with open("/proc/self/cmdline") as f:
      evaluating = f.read().startswith("ray::EvaluatorNode")
    if evaluating and not ray.get_runtime_context().was_current_actor_reconstructed:
      os._exit(1)  # As a crash would: no exception, no cleanup.
    return super().reset(**kwargs)


if "CartPoleCrashingTheEvaluator-v0" not in gym.registry:
  gym.register(id="CartPoleCrashingTheEvaluator-v0", entry_point=CartPoleCrashingTheEvaluator,
               max_episode_steps=500)
