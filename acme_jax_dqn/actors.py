"""Acting: a pure epsilon-greedy policy, epsilon schedules, and Acme's `Actor` and `VariableClient`."""

import dataclasses
import random
from typing import Callable, Optional, Tuple

import chex
import dm_env
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import acme_interop
from acme_jax_dqn.networks import Networks
from acme_jax_dqn.types import Params

PolicyFn = Callable[[Params, chex.PRNGKey, chex.Array, chex.Numeric], chex.Array]
GreedyFn = Callable[[Params, chex.Array], chex.Array]


@dataclasses.dataclass(frozen=True)
class LinearSchedule:
  """Linear decay from `start` to `end` over `decay_steps` steps, then flat.

  Callable on Python numbers (cheap, for actors on the host) and on JAX
  values (inside jit), with the same result.
  """
  start: float
  end: float
  decay_steps: float

  def __call__(self, step):
    if self.decay_steps <= 0:
      return self.end if isinstance(step, (int, float, np.integer)) else jnp.full_like(
          jnp.asarray(step, jnp.float32), self.end)
    fraction = step / self.decay_steps
    if isinstance(step, (int, float, np.integer, np.floating)):
      fraction = min(max(float(fraction), 0.0), 1.0)
    else:
      fraction = jnp.clip(fraction, 0.0, 1.0)
    return self.start + (self.end - self.start) * fraction


def make_epsilon_schedule(start: float, end: float, decay_steps: float) -> LinearSchedule:
  """Epsilon decays linearly from `start` to `end` over `decay_steps` env steps."""
  return LinearSchedule(start, end, decay_steps)


def apex_epsilons(num: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
  """Per-actor epsilons of Ape-X (Horgan et al. 2018): base ** (1 + alpha * i / (num - 1))."""
  if num == 1:
    return np.array([base], np.float32)
  i = np.arange(num, dtype=np.float64)
  return (base ** (1.0 + alpha * i / (num - 1))).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ConstantEpsilons:
  """A fixed epsilon per env copy (e.g. Ape-X's), whatever the step; host or jit."""
  epsilons: Tuple[float, ...]  # A tuple, so the schedule hashes (jit keys on it).

  def __post_init__(self):
    object.__setattr__(self, "epsilons", tuple(float(e) for e in self.epsilons))

  def __call__(self, step):
    if isinstance(step, (int, float, np.integer, np.floating)):
      return np.asarray(self.epsilons, np.float32)
    return jnp.asarray(self.epsilons, jnp.float32)


def make_epsilon_greedy_policy(networks: Networks, evaluation: bool = False) -> PolicyFn:
  """Returns `policy(params, key, observation [B, ...], epsilon) -> actions [B]`.

  `epsilon` is a scalar or one value per row ([B], e.g. Ape-X epsilons).
  Stochastic networks draw fresh noise (noisy layers) or fractions (IQN)
  from `key` at every call, except for `evaluation`, which acts on the
  mean weights and evenly spaced fractions.
  """

  def policy(params, key, observation, epsilon):
    if networks.stochastic and not evaluation:
      key, noise_key = jax.random.split(key)
      q_values = networks.apply(params, observation, noise_key).q_values  # [B, A]
    else:
      q_values = networks.apply(params, observation).q_values  # [B, A]
    batch_size, num_actions = q_values.shape
    # One draw for both choices: a split and randint's own would each cost a hash (on a GPU a
    # kernel of its own). u < 1, so floor(u * A) < A in float32's rounding.
    explore_u, action_u = jax.random.uniform(key, (2, batch_size))
    explore = explore_u < epsilon
    random_actions = jnp.floor(action_u * num_actions).astype(jnp.int32)
    greedy_actions = jnp.argmax(q_values, axis=-1)
    return jnp.where(explore, random_actions, greedy_actions).astype(jnp.int32)

  return policy


def make_greedy_policy(networks: Networks, evaluation: bool = False) -> GreedyFn:
  """Returns `greedy(params, observation [B, ...], noise_seed) -> argmax_a Q [B]`.

  Stochastic networks (noisy layers, IQN) draw from `noise_seed` (a
  uint32; the host actor draws one per call), except for `evaluation`
  (mean weights, evenly spaced fractions).
  """
  noise = networks.stochastic and not evaluation

  def greedy(params, observation, noise_seed):
    if noise:
      q_values = networks.apply(params, observation, jax.random.PRNGKey(noise_seed)).q_values
    else:
      q_values = networks.apply(params, observation).q_values
    return jnp.argmax(q_values, axis=-1).astype(jnp.int32)

  greedy.stochastic = noise
  return greedy


class VariableClient:
  """Acme's VariableClient: pulls parameters from a VariableSource every `update_period` calls."""

  def __init__(self, source, key: str = "policy", update_period: int = 1):
    self._source = source
    self._key = key
    self._update_period = max(1, int(update_period))
    self._calls = 0
    self._params = None

  def update(self, wait: bool = False) -> None:
    self._calls += 1
    if wait or self._params is None or self._calls >= self._update_period:
      self.update_and_wait()

  def update_and_wait(self) -> None:
    self._params = self._source.get_variables([self._key])[0]
    self._calls = 0

  @property
  def params(self) -> Params:
    if self._params is None:
      self.update_and_wait()
    return self._params

  def get_state(self) -> dict:
    """The pull counter and the parameters held (numpy), for checkpoints."""
    params = None if self._params is None else jax.device_get(self._params)
    return {"calls": self._calls, "params": params}

  def set_state(self, state: dict) -> None:
    self._calls = state["calls"]
    self._params = state["params"]


def _batch_timestep(timestep: dm_env.TimeStep) -> dm_env.TimeStep:
  """Adds a leading env axis of size 1 to an unbatched timestep."""
  return dm_env.TimeStep(
      step_type=np.asarray([timestep.step_type]),
      reward=np.asarray([0.0 if timestep.reward is None else timestep.reward], np.float32),
      discount=np.asarray([1.0 if timestep.discount is None else timestep.discount], np.float32),
      observation=np.asarray(timestep.observation)[None])


class Actor:
  """Acme-style actor: epsilon-greedy acting, optional adder, parameters from a client.

  Works on one dm_env environment (`num_envs=None`: unbatched observations
  and scalar actions) or on `num_envs` batched copies (arrays with a leading
  env axis). Epsilon follows `epsilon_fn(actor env steps)` and may be one
  value per copy (Ape-X). The explore-or-not coin and random actions are
  drawn on the host (numpy, seeded from `key`), and the jitted greedy
  network call is skipped when every copy explores: on the CPU one jitted
  call costs more than a CartPole step, so this is most of an actor's time
  early in training. The action distribution is that of
  `make_epsilon_greedy_policy`.
  """

  def __init__(self, greedy: GreedyFn, epsilon_fn: Callable[[int], float],
               variable_client: VariableClient, key: chex.PRNGKey,
               num_actions: int, adder=None, num_envs: Optional[int] = None):
    self._client = variable_client
    self._adder = adder
    self._batched = num_envs is not None
    self._num_envs = num_envs or 1
    self._num_actions = num_actions
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    seed = [int(x) for x in np.asarray(key).ravel()]
    self._rng = np.random.default_rng(seed)
    self._py_rng = random.Random(sum(x << (32 * i) for i, x in enumerate(seed)))
    self._noisy = getattr(greedy, "stochastic", False)  # Then it takes a noise seed per call.
    self._greedy_fn = jax.jit(greedy)
    self._epsilon_fn = epsilon_fn
    # Env steps observed by this actor (all copies; restart steps excluded).
    # It drives epsilon, so it counts in `observe`, where restarts are known.
    self.num_steps = 0

  def select_action(self, observation) -> np.ndarray:
    if not self._batched:
      return self._select_one(observation)
    n = self._num_envs
    explore = self._rng.random(n) < self._epsilon_fn(self.num_steps)
    if explore.all():
      actions = self._rng.integers(self._num_actions, size=n, dtype=np.int32)
    else:
      actions = np.asarray(self._greedy(observation, lambda: int(self._rng.integers(2**31))))
      if explore.any():
        actions = np.where(explore, self._rng.integers(self._num_actions, size=n,
                                                       dtype=np.int32), actions)
    return actions

  def _select_one(self, observation) -> int:
    """The unbatched path, in plain Python: a numpy call costs more than this whole step."""
    if self._py_rng.random() < self._epsilon_fn(self.num_steps):
      return self._py_rng.randrange(self._num_actions)
    return int(np.asarray(self._greedy(observation[None],
                                       lambda: self._py_rng.getrandbits(31)))[0])

  def _greedy(self, observation, draw_seed):
    """The jitted greedy call; a noisy network's noise seed comes from the host RNG."""
    seed = np.uint32(draw_seed() if self._noisy else 0)
    return self._greedy_fn(self._client.params, observation, seed)

  def observe_first(self, timestep: dm_env.TimeStep) -> None:
    if self._adder is not None:
      self._adder.add_first(timestep if self._batched else _batch_timestep(timestep))

  def observe(self, action, next_timestep: dm_env.TimeStep) -> None:
    if self._batched:
      self.num_steps += int(np.count_nonzero(next_timestep.step_type != dm_env.StepType.FIRST))
    else:
      self.num_steps += 1
    if self._adder is not None:
      if self._batched:
        self._adder.add(action, next_timestep)
      else:
        self._adder.add(np.asarray([action]), _batch_timestep(next_timestep))

  def update(self, wait: bool = False) -> None:
    self._client.update(wait)

  def get_state(self) -> dict:
    """RNG states, the step count and the client's parameters (picklable), for checkpoints."""
    return {"rng": self._rng.bit_generator.state, "py_rng": self._py_rng.getstate(),
            "num_steps": self.num_steps, "client": self._client.get_state(),
            "adder": None if self._adder is None else self._adder.get_state()}

  def set_state(self, state: dict) -> None:
    self._rng.bit_generator.state = state["rng"]
    self._py_rng.setstate(state["py_rng"])
    self.num_steps = state["num_steps"]
    self._client.set_state(state["client"])
    if self._adder is not None and state["adder"] is not None:
      self._adder.set_state(state["adder"])

  @property
  def epsilon(self) -> float:
    return float(np.mean(self._epsilon_fn(self.num_steps)))

  def warmup(self, observation) -> None:
    """Compiles the jitted greedy call (the RNG and counters are unchanged)."""
    if not self._batched:
      observation = np.asarray(observation)[None]
    jax.block_until_ready(self._greedy_fn(self._client.params, observation, np.uint32(0)))


acme_interop.register(Actor, "Actor")
