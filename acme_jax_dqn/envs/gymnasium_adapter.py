"""gymnasium environments as dm_env environments.

Termination and truncation stay apart: a terminated episode ends with
discount 0, a time-limit truncation ends with discount 1 (keep bootstrapping).
"""

from typing import Optional

import dm_env
from dm_env import specs
import gymnasium as gym
import numpy as np


def space_to_spec(space: gym.Space, name: str) -> specs.Array:
  """Converts a gymnasium space to a dm_env spec (Discrete -> DiscreteArray)."""
  if isinstance(space, gym.spaces.Discrete):
    return specs.DiscreteArray(num_values=int(space.n), dtype=np.int32, name=name)
  if isinstance(space, gym.spaces.Box):
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    if np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)):
      return specs.BoundedArray(space.shape, dtype, space.low.astype(dtype),
                                space.high.astype(dtype), name=name)
    return specs.Array(space.shape, dtype, name=name)
  raise ValueError(
      f"The {name} space {space} is not supported: only Discrete and Box spaces "
      "map to dm_env specs. Wrap the environment (e.g. FlattenObservation).")


def _action_offset(space: gym.Space) -> int:
  return int(getattr(space, "start", 0)) if isinstance(space, gym.spaces.Discrete) else 0


class GymnasiumEnvironment(dm_env.Environment):
  """One gymnasium environment behind the dm_env interface."""

  def __init__(self, env: gym.Env, seed: Optional[int] = None):
    self._env = env
    self._seed = seed
    self._observation_spec = space_to_spec(env.observation_space, "observation")
    self._action_spec = space_to_spec(env.action_space, "action")
    self._action_offset = _action_offset(env.action_space)
    self._dtype = self._observation_spec.dtype

  def reset(self) -> dm_env.TimeStep:
    observation, _ = self._env.reset(seed=self._seed)
    self._seed = None  # Seed once; later episodes continue the env's RNG.
    return dm_env.restart(np.asarray(observation, self._dtype))

  def step(self, action) -> dm_env.TimeStep:
    observation, reward, terminated, truncated, _ = self._env.step(
        int(action) + self._action_offset)
    observation = np.asarray(observation, self._dtype)
    if terminated:
      return dm_env.termination(float(reward), observation)
    if truncated:
      return dm_env.truncation(float(reward), observation)
    return dm_env.transition(float(reward), observation)

  def observation_spec(self):
    return self._observation_spec

  def action_spec(self):
    return self._action_spec

  def close(self):
    self._env.close()

  @property
  def gym_env(self) -> gym.Env:
    return self._env
