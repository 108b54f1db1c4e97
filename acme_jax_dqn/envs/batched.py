"""`num_envs` copies of a dm_env environment stepped together, resetting the dm_env way."""

import tracemalloc
from typing import Callable, List, Optional

import dm_env
import numpy as np

from acme_jax_dqn import xla_setup

_FIRST = np.int8(dm_env.StepType.FIRST)


def _made_and_measured(make_env: Callable[[int], dm_env.Environment], index: int):
  """(copy `index`, the bytes Python allocated for it, which tracemalloc counts)."""
  tracing = tracemalloc.is_tracing()
  if not tracing:
    tracemalloc.start()
  try:
    before = tracemalloc.get_traced_memory()[0]
    env = make_env(index)
    return env, max(0, tracemalloc.get_traced_memory()[0] - before)
  finally:
    if not tracing:
      tracemalloc.stop()


def check_copies_fit(num_envs: int, copy_bytes: int, limit: Optional[int] = None,
                     makers: int = 1) -> None:
  """Refuses `num_envs` copies of `copy_bytes` each that the host's memory cannot hold.

  `makers`: how many makers of `num_envs` copies share the host (the
  actors of a distributed run on one machine).
  """
  limit = xla_setup.host_memory_bytes() if limit is None else limit
  copies = num_envs * makers
  if limit and copies * copy_bytes > 0.9 * limit:
    each = f" for each of {makers} actors" if makers > 1 else ""
    raise ValueError(
        f"`num_envs`={num_envs}{each}: the {copies:,} environment copies need "
        f"{copies * copy_bytes / 2**30:.1f} GiB (about {copy_bytes:,} bytes each) and the "
        f"host holds {limit / 2**30:.1f} GiB. Use `num_envs` <= "
        f"{int(0.9 * limit) // copy_bytes // makers}.")


class BatchedEnvironment(dm_env.Environment):
  """Steps `num_envs` dm_env copies in turn; timesteps carry a leading env axis.

  After a copy returns LAST, its next step resets it and returns FIRST (the
  action given for it is ignored), as Acme's loops and our adder expect.
  Specs describe one copy. Measured on CartPole here, stepping copies in
  Python is faster than gymnasium's numpy-vectorised CartPole for 8 copies.
  More copies than the host's memory holds are refused after the third is
  made: `copy_bytes` is what Python allocated for one (C++ state, such as
  an emulator's, is not seen).
  """

  def __init__(self, make_env: Callable[[int], dm_env.Environment], num_envs: int):
    if num_envs < 1:
      raise ValueError(f"num_envs must be at least 1, got {num_envs}.")
    self.num_envs = num_envs
    self._envs: List[dm_env.Environment] = [make_env(0)]
    # Copies 1 and 2 are measured (the first also pays for one-time imports and caches),
    # and the smaller counts, in case another thread allocated meanwhile.
    sizes = []
    for i in range(1, min(3, num_envs)):
      env, size = _made_and_measured(make_env, i)
      self._envs.append(env)
      sizes.append(size)
    self.copy_bytes = min(sizes, default=0)
    try:
      check_copies_fit(num_envs, self.copy_bytes)
    except ValueError:
      self.close()
      raise
    self._envs.extend(make_env(i) for i in range(3, num_envs))
    self._last = [False] * num_envs

  def _stack(self, timesteps) -> dm_env.TimeStep:
    return dm_env.TimeStep(
        step_type=np.array([ts.step_type for ts in timesteps], np.int8),
        reward=np.array([ts.reward or 0.0 for ts in timesteps], np.float32),
        discount=np.array([1.0 if ts.discount is None else ts.discount
                           for ts in timesteps], np.float32),
        observation=np.stack([ts.observation for ts in timesteps]))

  def reset(self) -> dm_env.TimeStep:
    self._last = [False] * self.num_envs
    return self._stack([env.reset() for env in self._envs])

  def step(self, action) -> dm_env.TimeStep:
    timesteps = []
    for i, env in enumerate(self._envs):
      ts = env.reset() if self._last[i] else env.step(action[i])
      self._last[i] = ts.step_type == dm_env.StepType.LAST
      timesteps.append(ts)
    return self._stack(timesteps)

  def observation_spec(self):
    return self._envs[0].observation_spec()

  def action_spec(self):
    return self._envs[0].action_spec()

  def reward_spec(self):
    return self._envs[0].reward_spec()

  def discount_spec(self):
    return self._envs[0].discount_spec()

  def close(self):
    for env in self._envs:
      env.close()
