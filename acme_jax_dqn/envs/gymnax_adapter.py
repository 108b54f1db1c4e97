"""gymnax (JAX-native) environments: their functional form for anakin mode, and dm_env for local mode.

gymnax (>= 1.0) returns termination and truncation apart and, on auto-reset,
the last observation of the finished episode as `info["final_observation"]`;
both are what n-step targets need (a time limit keeps bootstrapping).
"""

from typing import Any, NamedTuple, Optional

import dm_env
from dm_env import specs
import jax
import numpy as np

from acme_jax_dqn import specs as specs_lib


class GymnaxEnv(NamedTuple):
  """A gymnax environment and its parameters, with its dm_env spec."""
  name: str
  env: Any  # gymnax.environments.environment.Environment
  params: Any  # Its EnvParams.
  spec: specs_lib.EnvironmentSpec
  max_episode_steps: int


def registered_ids():
  import gymnax  # Imported here: local runs on gymnasium do not need it.
  return tuple(gymnax.registered_envs)


def _space_to_spec(space, name: str) -> specs.Array:
  from gymnax.environments import spaces
  if isinstance(space, spaces.Discrete):
    return specs.DiscreteArray(num_values=int(space.n), dtype=np.int32, name=name)
  if isinstance(space, spaces.Box):
    return specs.Array(tuple(space.shape), np.dtype(space.dtype), name=name)
  raise ValueError(f"The {name} space {space} of this gymnax environment is not "
                   "supported: DQN needs a Box observation and Discrete actions.")


def make_gymnax(env_id: str) -> GymnaxEnv:
  """`gymnax.make(env_id)` plus its spec, with a clear error for unknown ids."""
  import gymnax
  if env_id not in gymnax.registered_envs:
    close = [k for k in gymnax.registered_envs
             if env_id.split("-")[0].lower() in k.lower()][:5]
    hint = f" Did you mean one of {close}?" if close else ""
    raise ValueError(f"gymnax has no environment {env_id!r}.{hint} Known ids: "
                     f"{', '.join(gymnax.registered_envs)}.")
  env, params = gymnax.make(env_id)
  spec = specs_lib.EnvironmentSpec(
      observations=_space_to_spec(env.observation_space(params), "observation"),
      actions=_space_to_spec(env.action_space(params), "action"),
      rewards=specs.Array((), np.float32, "reward"),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"))
  return GymnaxEnv(f"gymnax:{env_id}", env, params, spec,
                   int(params.max_steps_in_episode))


class GymnaxEnvironment(dm_env.Environment):
  """One gymnax environment behind dm_env, stepped by jitted calls (for local mode and tests)."""

  def __init__(self, gymnax_env: GymnaxEnv, seed: Optional[int] = None):
    self._g = gymnax_env
    self._key = jax.random.PRNGKey(0 if seed is None else seed)
    env, params = gymnax_env.env, gymnax_env.params
    self._reset = jax.jit(lambda key: env.reset(key, params))
    self._step = jax.jit(lambda key, state, action: env.step(key, state, action, params))
    self._state = None
    self._dtype = gymnax_env.spec.observations.dtype

  def reset(self) -> dm_env.TimeStep:
    self._key, key = jax.random.split(self._key)
    observation, self._state = self._reset(key)
    return dm_env.restart(np.asarray(observation, self._dtype))

  def step(self, action) -> dm_env.TimeStep:
    self._key, key = jax.random.split(self._key)
    # gymnax resets by itself; the finished episode's last observation is in info.
    _, self._state, reward, terminated, truncated, info = self._step(
        key, self._state, np.int32(action))
    observation = np.asarray(info["final_observation"], self._dtype)
    if bool(terminated):
      return dm_env.termination(float(reward), observation)
    if bool(truncated):
      return dm_env.truncation(float(reward), observation)
    return dm_env.transition(float(reward), observation)

  def observation_spec(self):
    return self._g.spec.observations

  def action_spec(self):
    return self._g.spec.actions
