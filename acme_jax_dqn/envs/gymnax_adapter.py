"""gymnax (JAX-native) environments: their functional form for anakin mode, and dm_env for local mode.

gymnax (>= 1.0) returns termination and truncation apart and, on auto-reset,
the last observation of the finished episode as `info["final_observation"]`;
both are what n-step targets need (a time limit keeps bootstrapping).
"""

import contextlib
import importlib
import sys
import types
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import dm_env
from dm_env import specs
import jax
import numpy as np

from acme_jax_dqn import specs as specs_lib
from acme_jax_dqn import xla_setup
from acme_jax_dqn.envs.scatter_selects import scatters_as_selects


class GymnaxEnv(NamedTuple):
  """A gymnax environment and its parameters, with its dm_env spec.

  `step` and `reset` are gymnax's, on these parameters; with
  `scatters_as_selects` they compute the same values with their
  single-index scatters as selects (acme_jax_dqn/envs/scatter_selects.py).
  On a GPU XLA fuses a select where it runs each scatter as a kernel of
  its own; on the CPU a select writes its whole array where a scatter
  writes an element in place. None (the default) picks by the device the
  program is built for: selects on an accelerator, gymnax's scatters on
  the CPU.
  """
  name: str
  env: Any  # gymnax.environments.environment.Environment
  params: Any  # Its EnvParams.
  spec: specs_lib.EnvironmentSpec
  max_episode_steps: int
  scatters_as_selects: Optional[bool] = None

  def uses_selects(self) -> bool:
    """Whether a program traced now steps with selects (`scatters_as_selects`, resolved)."""
    if self.scatters_as_selects is None:
      return xla_setup.target_platform() != "cpu"
    return self.scatters_as_selects

  def _compiled_form(self, fn):
    return scatters_as_selects(fn) if self.uses_selects() else fn  # Read as it is traced.

  def step(self, key, state, action):
    """(observation, state, reward, terminated, truncated, info): gymnax's `step`, which
    resets a finished episode (its last observation in `info["final_observation"]`)."""
    return self._compiled_form(
        lambda k, s, a: self.env.step(k, s, a, self.params))(key, state, action)

  def reset(self, key):
    """(observation, state) of a new episode."""
    return self._compiled_form(lambda k: self.env.reset(k, self.params))(key)


# Imported by gymnax's modules for rendering only (its Pong imports both):
# 1.4-2.0 s of its 2.0-2.5 s import on this 2-core machine, with jax loaded.
RENDER_ONLY_MODULES = ("seaborn", "matplotlib.pyplot")


class _ImportOnUse(types.ModuleType):
  """Stands in for a module while gymnax imports; the first attribute use imports the real one."""

  def __getattr__(self, attr):
    if sys.modules.get(self.__name__) is self:
      del sys.modules[self.__name__]
    return getattr(importlib.import_module(self.__name__), attr)


@contextlib.contextmanager
def _imports_deferred(names: Sequence[str]) -> Iterator[None]:
  """Within: `import name` gives a stand-in, for each of `names` not imported yet.

  After: `sys.modules` holds no stand-in, so later imports get the real
  modules; names bound to a stand-in forward to the real module on use.
  """
  placed = [name for name in names if name not in sys.modules]
  for name in placed:
    sys.modules[name] = _ImportOnUse(name)
  try:
    yield
  finally:
    for name in placed:
      if isinstance(sys.modules.get(name), _ImportOnUse):
        del sys.modules[name]


def import_gymnax():
  """gymnax, without loading its render-only imports (imported here: local runs on
  gymnasium do not need gymnax)."""
  with _imports_deferred(RENDER_ONLY_MODULES):
    import gymnax  # pylint: disable=import-outside-toplevel
  return gymnax


def registered_ids():
  return tuple(import_gymnax().registered_envs)


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
  gymnax = import_gymnax()
  if env_id not in gymnax.registered_envs:
    close = [k for k in gymnax.registered_envs
             if env_id.split("-")[0].lower() in k.lower()][:5]
    hint = f" Did you mean one of {close}?" if close else ""
    raise ValueError(f"gymnax has no environment {env_id!r}.{hint} Known ids: "
                     f"{', '.join(gymnax.registered_envs)}.")
  try:
    env, params = gymnax.make(env_id)
  except OSError as error:  # MNISTBandit-bsuite downloads MNIST as it is made.
    raise ValueError(f"gymnax could not make {env_id!r}: {error}. It fetches data as it "
                     "makes this environment: run where that download can reach the "
                     "internet, or pick another environment.") from error
  with xla_setup.on_host():  # The spaces hold small arrays that gymnax computes eagerly.
    observation_space, action_space = env.observation_space(params), env.action_space(params)
  spec = specs_lib.EnvironmentSpec(
      observations=_space_to_spec(observation_space, "observation"),
      actions=_space_to_spec(action_space, "action"),
      rewards=specs.Array((), np.float32, "reward"),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"))
  return GymnaxEnv(f"gymnax:{env_id}", env, params, spec,
                   int(params.max_steps_in_episode))


class GymnaxEnvironment(dm_env.Environment):
  """One gymnax environment behind dm_env, stepped by jitted calls (for local mode and tests)."""

  def __init__(self, gymnax_env: GymnaxEnv, seed: Optional[int] = None):
    self._g = gymnax_env
    self._key = jax.random.PRNGKey(0 if seed is None else seed)
    self._reset = jax.jit(gymnax_env.reset)
    self._step = jax.jit(gymnax_env.step)
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
