"""PQN (Gallici et al. 2024): Q(lambda) on fresh rollouts, with no target network and no replay.

A rollout is `rollout_len` env steps of `num_envs` copies (leaves [T, E]).
Its targets are Q(lambda) returns, computed once with the parameters that
collected it (`q_lambda_returns`); then `num_epochs` passes over the
rollout, each in `num_minibatches` shuffled minibatches, regress Q(s, a)
on them through the kit's `sgd_step` with `losses.ReturnRegressionLoss`.

`make_rollout_update` is that update as one pure function. The anakin
program (`acme_jax_dqn.anakin_pqn`) calls it after every rollout; in local
mode `RolloutAdder` and `RolloutBuffer` stand where the n-step adder and
the replay stand for DQN, so the kit's `Learner` runs it on each rollout.
"""

import types
from typing import Callable, List, NamedTuple, Optional

import chex
import dm_env
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import learning
from acme_jax_dqn.networks import Networks
from acme_jax_dqn.replay import ReplaySample
from acme_jax_dqn.types import TrainingState

_FIRST = int(dm_env.StepType.FIRST)
_LAST = int(dm_env.StepType.LAST)


class RolloutStep(NamedTuple):
  """One env step of every copy (leaves [E, ...]); a rollout stacks T of them ([T, E, ...]).

  `env_discount` is 0 on a termination and 1 otherwise; `end` is 1 on the
  last step of an episode, terminated or truncated; `next_observation` is
  the true next observation (the final one at an episode end). `valid` is
  0 for a step that is not a transition: the restart step of a dm_env
  loop, whose action the environment ignored.
  """
  observation: chex.Array
  action: chex.Array
  reward: chex.Array
  env_discount: chex.Array
  end: chex.Array
  next_observation: chex.Array
  valid: chex.Array


class ReturnTarget(NamedTuple):
  """A minibatch item of `ReturnRegressionLoss`: leaves [B, ...]."""
  observation: chex.Array
  action: chex.Array
  target_return: chex.Array


def q_lambda_returns(reward: chex.Array, discount: chex.Array, end: chex.Array,
                     next_value: chex.Array, lambda_: float) -> chex.Array:
  """Q(lambda) returns of a rollout, all leaves [T, E].

  G_t = r_t + d_t ((1 - l_t) v_{t+1} + l_t G_{t+1}), from the last step back,
  where `discount` d_t is gamma times the env discount (0 after a
  termination, gamma after a truncation), `next_value` v_{t+1} is
  max_a Q(s_{t+1}, a) at the true next observation, and l_t = lambda (1 -
  end_t): no return reaches across an episode end, and the rollout's last
  step bootstraps from v alone. `rlax.lambda_returns` per env copy.
  """
  import rlax  # pylint: disable=import-outside-toplevel  # Imported by a learner alone.
  lambdas = lambda_ * (1.0 - end)
  return jax.vmap(rlax.lambda_returns, in_axes=1, out_axes=1)(
      reward, discount, next_value, lambdas)


def make_rollout_update(networks: Networks, sgd_step: learning.SGDStepFn, discount: float,
                        lambda_: float, num_epochs: int, num_minibatches: int):
  """`update(state, rollout [T, E]) -> (state, rollout, metrics)`: PQN's update on one rollout.

  The returns come from the online parameters before the update (PQN has no
  target network); each epoch shuffles the T x E steps with a key split
  from the state's and takes `num_minibatches` SGD steps. Invalid steps
  (`valid` 0) have mask 0: they weigh nothing in a minibatch's loss.
  Metrics are means over the update's SGD steps, plus the mean return.
  """

  def update(state: TrainingState, rollout: RolloutStep):
    T, E = rollout.reward.shape
    count = T * E
    size = count // num_minibatches
    flat = lambda x: x.reshape((count,) + x.shape[2:])
    next_q = networks.apply(state.online_params, flat(rollout.next_observation)).q_values
    next_value = jnp.max(next_q, axis=-1).reshape(T, E)
    returns = q_lambda_returns(rollout.reward, discount * rollout.env_discount,
                               rollout.end.astype(jnp.float32), next_value, lambda_)
    items = (ReturnTarget(flat(rollout.observation), flat(rollout.action), flat(returns)),
             flat(rollout.valid.astype(jnp.float32)))

    def minibatch(state, batch):
      targets, valid = batch
      sample = ReplaySample(targets, jnp.zeros((size,), jnp.int32),
                            jnp.ones((size,), jnp.float32), valid)
      state, metrics = sgd_step(state, sample)
      del metrics["priorities"]
      return state, metrics

    def epoch(state, _):
      key, order_key = jax.random.split(state.key)
      order = jax.random.permutation(order_key, count)
      batches = jax.tree.map(
          lambda x: x[order].reshape((num_minibatches, size) + x.shape[1:]), items)
      return jax.lax.scan(minibatch, state._replace(key=key), batches)

    state, metrics = jax.lax.scan(epoch, state, None, length=num_epochs)
    metrics = jax.tree.map(jnp.mean, metrics)
    valid = items[1]
    metrics["lambda_return_mean"] = jnp.sum(flat(returns) * valid) / jnp.maximum(
        jnp.sum(valid), 1.0)
    return state, rollout, metrics

  return update


class RolloutAdder:
  """Writes each step of `num_envs` auto-resetting dm_env copies to `sink` as a `RolloutStep`.

  Timesteps arrive batched (leaves [E, ...]). A copy's restart step (FIRST
  after LAST) is written with `valid` 0, `end` 1 and `env_discount` 0, so
  every rollout has one shape and no return reaches through it.
  """

  def __init__(self, sink: Callable[[RolloutStep], None], num_envs: int,
               reward_clip: float = 0.0, on_restart: Optional[Callable[[], None]] = None):
    self._sink, self._num_envs, self._reward_clip = sink, num_envs, float(reward_clip)
    self._on_restart = on_restart
    self._observation = None

  def add_first(self, timestep: dm_env.TimeStep) -> None:
    """A new start. After earlier steps (a new episode of one env, or a resume that could
    not restore the environments) the last step written ends its episode (`on_restart`)."""
    if self._observation is not None and self._on_restart is not None:
      self._on_restart()
    self._observation = np.array(timestep.observation, copy=True)

  def add(self, action, next_timestep: dm_env.TimeStep) -> None:
    if self._observation is None:
      raise RuntimeError("add_first must be called before add.")
    step_type = np.asarray(next_timestep.step_type)
    valid = step_type != _FIRST
    reward = np.nan_to_num(np.asarray(next_timestep.reward, np.float32)) * valid
    if self._reward_clip > 0:
      reward = np.clip(reward, -self._reward_clip, self._reward_clip)
    env_discount = np.where(valid, np.asarray(next_timestep.discount, np.float32), 0.0)
    next_observation = np.array(next_timestep.observation, copy=True)
    self._sink(RolloutStep(
        self._observation, np.asarray(action, np.int32), reward.astype(np.float32),
        env_discount.astype(np.float32), ((step_type == _LAST) | ~valid).astype(np.float32),
        next_observation, valid.astype(np.float32)))
    self._observation = next_observation

  def get_state(self) -> dict:
    return {"observation": self._observation}

  def set_state(self, state: dict) -> None:
    self._observation = state["observation"]


class RolloutBuffer:
  """Stages `RolloutStep`s on the host and hands the learner each rollout [T, E] once.

  It offers what the kit's `Learner` asks of a `ReplayBuffer`: a rollout
  is a chunk, `replay.add` makes it the device state, and the learner step
  (`make_rollout_update`) learns from it in the same jitted call. Nothing
  is kept once learned from: PQN is on-policy.
  """

  def __init__(self, example: RolloutStep, rollout_len: int):
    self.replay = types.SimpleNamespace(add=lambda state, rollout: rollout)
    self.rollout_len = rollout_len
    self._example = jax.tree.map(np.asarray, example)
    self.state = jax.tree.map(jnp.asarray, self.example_chunk())
    self._staged: List[RolloutStep] = []
    self.num_written = 0  # Rollouts handed to the learner.

  def insert(self, step: RolloutStep) -> None:
    self._staged.append(step)

  @property
  def pending_chunks(self) -> int:
    return len(self._staged) // self.rollout_len

  @property
  def num_inserted(self) -> int:
    """Env steps of every copy in complete rollouts (restart steps included)."""
    steps = self.rollout_len * len(self._example.action)
    return (self.num_written + self.pending_chunks) * steps

  def pop_chunk(self) -> RolloutStep:
    if not self.pending_chunks:
      raise RuntimeError("No complete rollout is staged.")
    steps, self._staged = self._staged[:self.rollout_len], self._staged[self.rollout_len:]
    self.num_written += 1
    return jax.tree.map(lambda *xs: np.stack(xs), *steps)

  def cut(self) -> None:
    """Ends every copy's episode at the last staged step (truncated: it still bootstraps)."""
    if self._staged:
      last = self._staged[-1]
      self._staged[-1] = last._replace(end=np.ones_like(last.end))

  def write_pending(self, keep: int = 0) -> None:
    """Drops complete rollouts beyond `keep` (they were not learned from), keeping the newest."""
    while self.pending_chunks > keep:
      self.state = jax.tree.map(jnp.asarray, self.pop_chunk())

  def get_host_state(self) -> dict:
    return {"staged": list(self._staged), "num_written": self.num_written}

  def set_host_state(self, host_state: dict) -> None:
    self._staged = list(host_state["staged"])
    self.num_written = host_state["num_written"]

  def example_chunk(self) -> RolloutStep:
    return jax.tree.map(lambda x: np.zeros((self.rollout_len,) + x.shape, x.dtype),
                        self._example)

  def warmup(self) -> None:
    """Nothing to compile: a rollout enters the device inside the learner's call."""
