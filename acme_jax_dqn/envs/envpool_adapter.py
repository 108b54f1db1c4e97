"""envpool: `num_envs` copies stepped together in C++ threads, as one batched dm_env environment.

`envpool:CartPole-v1`, `envpool:Pong-v5`, ... (`envpool.list_all_envs()`).
Timesteps carry a leading env axis and reset the way `BatchedEnvironment`
does: after a copy returns LAST its next step returns FIRST (envpool
resets it and ignores its action), so the same adder and loops take
either. Atari tasks get the settings of `atari:` games (sticky actions
0.25, no fire reset, no life loss, 84x84x4 grayscale, frame skip 4, 30
no-ops, 108,000 frames), moved to channels-last.
"""

import os
import warnings
from typing import Optional

import dm_env
import numpy as np

from acme_jax_dqn.envs import atari
from acme_jax_dqn.envs.gymnasium_adapter import space_to_spec

_FIRST, _MID, _LAST = (np.int8(t) for t in dm_env.StepType)


def _envpool():
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)
      import envpool  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("envpool: environments need the envpool package: "
                     "pip install envpool (or, in the kit's checkout, pip install -e "
                     "'.[envpool]').") from None
  return envpool


def _is_atari(task_id: str, envpool) -> bool:
  fields = envpool.make_spec(task_id).config._asdict()
  return "use_fire_reset" in fields and "stack_num" in fields


class EnvpoolEnvironment(dm_env.Environment):
  """`num_envs` envpool copies; specs describe one copy."""

  def __init__(self, task_id: str, num_envs: int, seed: Optional[int] = None):
    envpool = _envpool()
    if task_id not in envpool.list_all_envs():
      close = [t for t in envpool.list_all_envs() if task_id.split("-")[0].lower() in t.lower()]
      hint = f" Did you mean {', '.join('envpool:' + t for t in close[:5])}?" if close else ""
      raise ValueError(f"envpool has no task {task_id!r}.{hint}")
    kwargs = {}
    self._channels_last = _is_atari(task_id, envpool)
    if self._channels_last:
      kwargs = dict(stack_num=atari.STACK, frame_skip=atari.FRAME_SKIP,
                    noop_max=atari.NOOP_MAX, img_height=atari.SCREEN_SIZE,
                    img_width=atari.SCREEN_SIZE, gray_scale=True, episodic_life=False,
                    reward_clip=False, use_fire_reset=False,
                    repeat_action_probability=atari.STICKY_ACTIONS,
                    max_episode_steps=atari.MAX_FRAMES // atari.FRAME_SKIP)
    self.num_envs = num_envs
    # Threads: timed ad hoc on 2 cores with 8 copies, one thread was fastest
    # for CartPole-sized tasks (the thread hand-off is the cost) and one per
    # core for Atari; bench/speed.py and bench/atari_throughput.py measure
    # the results.
    num_threads = min(num_envs, os.cpu_count() or 1) if self._channels_last else 1
    with warnings.catch_warnings():  # envpool's spaces cast float64 bounds: gymnasium warns.
      warnings.simplefilter("ignore", UserWarning)
      self._env = envpool.make(task_id, env_type="gymnasium", num_envs=num_envs,
                               num_threads=num_threads, seed=0 if seed is None else seed,
                               **kwargs)
      self._action_spec = space_to_spec(self._env.action_space, "action")
      spec = space_to_spec(self._env.observation_space, "observation")
    if self._channels_last:
      shape = spec.shape[1:] + spec.shape[:1]
      spec = spec.replace(shape=shape, minimum=np.zeros(shape, spec.dtype),
                          maximum=np.full(shape, 255, spec.dtype))
    self._observation_spec = spec
    self._dtype = spec.dtype

  def _observation(self, observation) -> np.ndarray:
    if self._channels_last:
      return np.moveaxis(observation, 1, -1)  # [N, C, H, W] -> [N, H, W, C], a view.
    return observation.astype(self._dtype, copy=False)

  def reset(self) -> dm_env.TimeStep:
    observation, _ = self._env.reset()
    n = self.num_envs
    return dm_env.TimeStep(np.full(n, _FIRST), np.zeros(n, np.float32),
                           np.ones(n, np.float32), self._observation(observation))

  def step(self, action) -> dm_env.TimeStep:
    observation, reward, terminated, truncated, info = self._env.step(
        np.asarray(action, np.int32))
    first = info["elapsed_step"] == 0  # Reset by this call (after LAST): reward 0, discount 1.
    step_type = np.full(self.num_envs, _MID)
    step_type[terminated | truncated] = _LAST
    step_type[first] = _FIRST
    discount = (~(terminated & ~first)).astype(np.float32)  # 0 only on termination.
    reward = reward.astype(np.float32)
    reward[first] = 0.0
    return dm_env.TimeStep(step_type, reward, discount, self._observation(observation))

  def observation_spec(self):
    return self._observation_spec

  def action_spec(self):
    return self._action_spec

  def close(self):
    self._env.close()


class UnbatchedEnvironment(dm_env.Environment):
  """One copy of a batched environment (num_envs=1) as a plain dm_env environment."""

  def __init__(self, batched: dm_env.Environment):
    self._batched = batched

  @staticmethod
  def _first(timestep: dm_env.TimeStep) -> dm_env.TimeStep:
    return dm_env.TimeStep(dm_env.StepType(int(timestep.step_type[0])),
                           None if timestep.step_type[0] == _FIRST else float(timestep.reward[0]),
                           None if timestep.step_type[0] == _FIRST else float(timestep.discount[0]),
                           timestep.observation[0])

  def reset(self) -> dm_env.TimeStep:
    return self._first(self._batched.reset())

  def step(self, action) -> dm_env.TimeStep:
    return self._first(self._batched.step(np.asarray([action])))

  def observation_spec(self):
    return self._batched.observation_spec()

  def action_spec(self):
    return self._batched.action_spec()

  def close(self):
    self._batched.close()
