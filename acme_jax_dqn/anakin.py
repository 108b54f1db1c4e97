"""Anakin: act, step, store, learn and update the target inside one compiled program.

For environments written in JAX (gymnax) the whole training loop is a
`lax.scan` under `jit`: epsilon-greedy actions for `num_envs` copies
(vmapped), the environment step with auto-reset, n-step transitions into a
flashbax buffer on the device, learner steps at a fixed samples-per-insert
ratio, and the target update. Every piece is the kit's own pure function
(the same `learner_step` the local `Learner` jits, the same policy, the
same replay), so each DQN variant runs here unchanged.

The program is pure in one seed's state; callers vmap it over seeds.
Training runs in chunks (`train_chunk`): one compiled call per chunk, so
metrics leave the device once per chunk and the host can print progress,
as in Stoix's anakin systems; a run of one chunk is one call.
"""

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from acme_jax_dqn import learning
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import seeding
from acme_jax_dqn import target_updates
from acme_jax_dqn.anakin_loops import carry_scan, summed_scan, zeros_of_output
from acme_jax_dqn.actors import PolicyFn
from acme_jax_dqn.envs.gymnax_adapter import GymnaxEnv
from acme_jax_dqn.networks import Networks
from acme_jax_dqn.types import TrainingState, Transition


class NStepWindow(NamedTuple):
  """The last n env steps of every copy, oldest first: leaves [n, E, ...] (one step: [E, ...]).

  `env_discount` is 0 on a termination and 1 otherwise; `end` marks the
  last step of an episode (terminated or truncated); `next_observation`
  is the true next observation (the final one at an episode end, not the
  auto-reset one).
  """
  observation: chex.Array
  action: chex.Array
  reward: chex.Array
  env_discount: chex.Array
  end: chex.Array
  next_observation: chex.Array


class AnakinState(NamedTuple):
  """One seed's whole training state: learner, replay, environments and counters."""
  learner: TrainingState
  buffer: replay_lib.BufferState
  env_state: Any  # gymnax states, leaves [E, ...].
  observation: chex.Array  # [E, ...]
  window: NStepWindow
  episode_return: chex.Array  # [E] return of the running episode.
  env_steps: chex.Array  # int32: env steps of this seed, all copies counted.
  key: chex.PRNGKey  # Exploration and environment randomness.


class StepStats(NamedTuple):
  return_sum: chex.Array  # Sum of the returns of episodes that ended this step.
  episodes: chex.Array  # How many ended.


def nstep_transition(window: NStepWindow, discount: float) -> Transition:
  """The n-step transition that starts at the window's oldest step, for every copy.

  The return sums gamma^k r_k up to the first episode end inside the
  window; the bootstrap multiplier is gamma^(m+1) times the env discount of
  that last step m (0 after a termination, so truncation keeps
  bootstrapping), and `next_observation` is the observation after step m.
  This equals what the local `NStepTransitionAdder` writes for that step.
  """
  n = window.reward.shape[0]
  ended = window.end.astype(jnp.float32)  # [n, E]
  # alive[k] = 1 while no episode ended before step k.
  alive = jnp.cumprod(jnp.concatenate([jnp.ones_like(ended[:1]), 1.0 - ended[:-1]]), axis=0)
  powers = discount ** jnp.arange(n, dtype=jnp.float32)
  reward = jnp.sum(powers[:, None] * alive * window.reward, axis=0)
  is_last = alive * jnp.maximum(ended, (jnp.arange(n) == n - 1)[:, None])  # One-hot in k.
  last = jnp.argmax(is_last, axis=0)  # [E]
  env_discount = jnp.take_along_axis(window.env_discount, last[None], axis=0)[0]
  bootstrap = discount ** (last.astype(jnp.float32) + 1.0) * env_discount
  take = lambda x: jnp.take_along_axis(
      x, last.reshape((1, -1) + (1,) * (x.ndim - 2)), axis=0)[0]
  return Transition(observation=window.observation[0], action=window.action[0],
                    reward=reward, discount=bootstrap,
                    next_observation=take(window.next_observation))


class Anakin(NamedTuple):
  """The pure functions of the compiled trainer (one seed; vmap them over seeds).

  Attributes:
    init: key -> AnakinState (params, empty replay, reset environments,
      and `fill_steps` env steps that fill the n-step window).
    train_chunk: (state, first_iteration, num_iterations, warmup=None, unroll=1,
      acting_apart=False, packed_carry=True) ->
      (state, metrics); each iteration is `env_steps_per_iteration` env
      steps, then, once replay holds `min_replay_size` transitions,
      `learner_calls_per_iteration` learner steps. `first_iteration` counts
      the iterations run before (an int32, not vmapped over seeds);
      `num_iterations` is static (one compilation per value). With `warmup`
      None a conditional on the iteration index decides, every iteration,
      whether it learns; with `warmup` = `chunk_warmup(anakin,
      first_iteration, num_iterations)` (static) the chunk runs its warm-up
      iterations as one loop and the rest as another, with no conditional,
      each summing its metrics in its carry. Both train the same
      parameters, and their chunk metrics agree to float rounding.
      `unroll` (static): iterations per step of those loops (`lax.scan`'s
      unroll); the same computation in fewer, larger loop steps.
      `packed_carry` (static, default True): the loops carry the
      environments, counters and keys in one word vector
      (`anakin_loops.carry_scan`); the same computation in fewer kernels
      (a run packs a block of one seed: `agents.dqn.seed_layout`).
      `acting_apart` (static): in the loop that learns, the acting forward
      reads the online parameters through an optimization barrier, so that
      XLA's GPU compiler does not merge it with the learner's forward on the
      same parameters into one matmul over the concatenated inputs. The
      same computation; see `agents.dqn.seed_layout.acting_apart` for when.
      A chunk with the conditional (`warmup` None) has no such loop.
    evaluate: (params, key) -> returns [eval_episodes] of the greedy policy.
    learn: state -> (state, metrics); the learner calls of one iteration.
    learner_step: the kit's `learner_step(state, buffer)`, shared with the local Learner.
  """
  init: Callable[[chex.PRNGKey], AnakinState]
  train_chunk: Callable[..., Any]
  evaluate: Callable[[Any, chex.PRNGKey], chex.Array]
  learn: Callable[[AnakinState], Any]
  learner_step: learning.LearnerStepFn
  fill_steps: int
  env_steps_per_iteration: int
  learner_calls_per_iteration: int
  warmup_iterations: int = 0  # Iterations before the first that learns.


def make_anakin(env: GymnaxEnv, networks: Networks, optimizer: optax.GradientTransformation,
                learner_step: learning.LearnerStepFn, replay: replay_lib.Replay,
                policy: PolicyFn, epsilon_fn: Callable[[chex.Array], chex.Array],
                example_transition: Transition, *, num_envs: int, n_step: int, discount: float, min_replay_size: int,
                env_steps_per_iteration: int, learner_calls_per_iteration: int,
                eval_episodes: int, eval_epsilon: float = 0.0,
                reward_clip: float = 0.0, eval_policy: Optional[PolicyFn] = None) -> Anakin:
  """Builds the compiled trainer from the kit's pure parts.

  Args:
    env: the gymnax environment.
    networks, optimizer: as for the local learner (the optimizer initialises
      the TrainingState).
    learner_step: `learner_step(training_state, buffer_state)`, e.g.
      `DQNBuilder.make_learner_step`; the same function the local Learner runs.
    replay: the kit's pure replay functions (flashbax).
    policy: `policy(params, key, observations [E, ...], epsilon)`.
    epsilon_fn: env steps (int32) -> epsilon, a scalar or one per copy [E].
    example_transition: one unbatched transition (shapes and dtypes of replay items).
    num_envs: environment copies stepped together (vmapped).
    n_step, discount: the n-step return.
    min_replay_size: transitions in replay before the first learner step.
    env_steps_per_iteration, learner_calls_per_iteration: the
      samples-per-insert ratio as whole numbers: every iteration steps all
      copies this many times, then takes that many learner steps.
    eval_episodes: greedy episodes per evaluation (run in parallel).
    eval_epsilon: epsilon of the evaluation policy.
    reward_clip: c > 0 clips each env reward to [-c, c] before the n-step
      sum (episode returns stay unclipped), as the local adder does.
    eval_policy: the evaluation's policy (default `policy`; noisy networks
      evaluate on their mean weights).
  """
  eval_policy = eval_policy or policy
  obs_spec = env.spec.observations
  obs_shape, obs_dtype = tuple(obs_spec.shape), obs_spec.dtype
  E = num_envs
  fill_steps = n_step - 1  # Env steps (in `init`) before the first full n-step window.

  def env_step(state: AnakinState, acting_apart: bool = False):
    """All copies act and step once; returns the state, the emitted transitions [E] and stats."""
    state, step, stats = step_copies(env, policy, epsilon_fn, state, reward_clip, acting_apart)
    window = jax.tree.map(lambda w, x: jnp.concatenate([w[1:], x[None]]), state.window, step)
    return state._replace(window=window), nstep_transition(window, discount), stats

  def step_and_store(state: AnakinState, _, acting_apart: bool = False):
    state, transition, stats = env_step(state, acting_apart)
    return state._replace(buffer=replay.add(state.buffer, transition)), stats

  def init(key):
    """Fresh parameters, empty replay, reset environments; then n - 1 steps fill the window."""
    learner_key, env_key, key = jax.random.split(key, 3)
    learner_state = learning.init_training_state(networks, optimizer, learner_key)
    observation, env_state = reset_copies(env, env_key, E)
    zeros = lambda shape, dtype: jnp.zeros((n_step, E) + shape, dtype)
    window = NStepWindow(zeros(obs_shape, obs_dtype), zeros((), jnp.int32),
                         zeros((), jnp.float32), zeros((), jnp.float32),
                         zeros((), jnp.bool_), zeros(obs_shape, obs_dtype))
    state = AnakinState(learner=learner_state, buffer=replay.init(example_transition),
                        env_state=env_state, observation=observation,
                        window=window, episode_return=jnp.zeros((E,), jnp.float32),
                        env_steps=jnp.zeros((), jnp.int32), key=key)
    if fill_steps:  # Until the window is full its oldest entries are not real steps.
      state = jax.lax.fori_loop(0, fill_steps, lambda _, s: env_step(s)[0], state)
    return state

  def learn_once(state: AnakinState, _):
    learner_state, buffer, metrics = learner_step(state.learner, state.buffer)
    return state._replace(learner=learner_state, buffer=buffer), metrics

  def learn(state: AnakinState):
    if learner_calls_per_iteration == 1:
      return learn_once(state, None)
    state, metrics = jax.lax.scan(target_updates.traced_anew(learn_once), state, None,
                                  length=learner_calls_per_iteration)
    return state, jax.tree.map(jnp.mean, metrics)

  metric_shapes = jax.eval_shape(lambda s: learn(s)[1], jax.eval_shape(init, seeding.key_shape()))

  def skip_learning(state: AnakinState):
    return state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metric_shapes)

  inserts_per_iteration = env_steps_per_iteration * E

  def act_iteration(state: AnakinState, _, acting_apart: bool = False, packed: bool = True):
    store = functools.partial(step_and_store, acting_apart=acting_apart)
    if env_steps_per_iteration == 1:
      return store(state, None)
    state, stats = carry_scan(store, state, None, env_steps_per_iteration, packed=packed)
    return state, jax.tree.map(jnp.sum, stats)

  def iteration(state: AnakinState, index: chex.Array, packed: bool = True):
    state, stats = act_iteration(state, None, packed=packed)
    # Learning starts once replay holds `min_replay_size` transitions. The
    # test reads the iteration index, which is the same for every seed: a
    # predicate batched by vmap would turn the cond into a select that
    # always runs the learner.
    learning_now = (index + 1) * inserts_per_iteration >= min_replay_size
    state, metrics = jax.lax.cond(learning_now, target_updates.traced_anew(learn), skip_learning,
                                  state)
    return state, (stats, metrics, learning_now.astype(jnp.float32))

  def learn_iteration(state: AnakinState, _, acting_apart: bool = False, packed: bool = True):
    state, stats = act_iteration(state, None, acting_apart, packed)
    state, metrics = learn(state)
    return state, (stats, metrics)

  def train_chunk(state: AnakinState, first_iteration: chex.Array, num_iterations: int,
                  warmup: Optional[int] = None, unroll: int = 1, acting_apart: bool = False,
                  packed_carry: bool = True):
    if warmup is None:
      indices = first_iteration + jnp.arange(num_iterations, dtype=jnp.int32)
      state, (stats, metrics, learned) = carry_scan(
          functools.partial(iteration, packed=packed_carry), state, indices, unroll=unroll,
          packed=packed_carry)
      sums = jax.tree.map(lambda m: jnp.sum(m * learned), metrics)
      return state, chunk_metrics(state, jax.tree.map(jnp.sum, stats), sums,
                                  jnp.sum(learned), epsilon_fn)
    # The warm-up and the learning iterations each run as a loop of their own, which sums
    # its stats and metrics in its carry: a chunk's row needs only the sums, and on a GPU a
    # stacked output is one more write kernel per metric in every iteration.
    if not 0 <= warmup <= num_iterations:
      raise ValueError(f"warmup={warmup}: between 0 and num_iterations={num_iterations}.")
    acting = functools.partial(act_iteration, packed=packed_carry)
    if warmup:
      state, stats = summed_scan(acting, state, warmup, unroll, packed_carry)
    else:
      stats = zeros_of_output(act_iteration, state)
    learning = num_iterations - warmup
    if learning:
      state, (learn_stats, sums) = summed_scan(
          functools.partial(learn_iteration, acting_apart=acting_apart, packed=packed_carry),
          state, learning, unroll, packed_carry)
      stats = jax.tree.map(jnp.add, stats, learn_stats)
    else:
      sums = skip_learning(state)[1]  # Zeros: the row's metrics read NaN.
    return state, chunk_metrics(state, stats, sums, jnp.float32(learning), epsilon_fn)

  return Anakin(init=init, train_chunk=train_chunk,
                evaluate=make_evaluate(env, eval_policy, eval_episodes, eval_epsilon), learn=learn,
                learner_step=learner_step, fill_steps=fill_steps,
                env_steps_per_iteration=env_steps_per_iteration,
                learner_calls_per_iteration=learner_calls_per_iteration,
                warmup_iterations=max(0, -(-min_replay_size // inserts_per_iteration) - 1))


def chunk_warmup(anakin: Anakin, first_iteration: int, num_iterations: int) -> int:
  """How many of a chunk's iterations come before learning starts (its static `warmup`)."""
  return min(num_iterations, max(0, anakin.warmup_iterations - first_iteration))


def split_step_keys(key: chex.PRNGKey, num_envs: int):
  """(the next key, the policy's key, one key per copy [E]): one hash of `key` for all."""
  keys = jax.random.split(key, num_envs + 2)
  return keys[0], keys[1], keys[2:]


def step_copies(env: GymnaxEnv, policy: PolicyFn, epsilon_fn, state, reward_clip: float = 0.0,
                acting_apart: bool = False):
  """All copies act (epsilon-greedy on the online params) and step once, with auto-reset.

  `state` is any trainer state with the fields `learner`, `env_state`,
  `observation`, `episode_return`, `env_steps` and `key`. Returns the
  state moved on, the step (an `NStepWindow` entry, leaves [E, ...]) and its
  `StepStats`. `acting_apart`: act on the online parameters through an
  optimization barrier (see `Anakin.train_chunk`).
  """
  obs_dtype = env.spec.observations.dtype
  num_envs = state.observation.shape[0]
  key, act_key, env_keys = split_step_keys(state.key, num_envs)
  online_params = state.learner.online_params
  if acting_apart:
    online_params = jax.lax.optimization_barrier(online_params)
  action = policy(online_params, act_key, state.observation,
                  epsilon_fn(state.env_steps))
  next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step)(
      env_keys, state.env_state, action)
  reward = reward.astype(jnp.float32)
  stored_reward = jnp.clip(reward, -reward_clip, reward_clip) if reward_clip > 0 else reward
  end = jnp.logical_or(terminated, truncated)
  entry = NStepWindow(state.observation, action, stored_reward,
                      1.0 - terminated.astype(jnp.float32), end,
                      info["final_observation"].astype(obs_dtype))
  episode_return = state.episode_return + reward
  stats = StepStats(jnp.sum(jnp.where(end, episode_return, 0.0)),
                    jnp.sum(end.astype(jnp.float32)))
  state = state._replace(env_state=env_state, observation=next_obs.astype(obs_dtype),
                         episode_return=jnp.where(end, 0.0, episode_return),
                         env_steps=state.env_steps + num_envs, key=key)
  return state, entry, stats


def reset_copies(env: GymnaxEnv, key: chex.PRNGKey, num_envs: int):
  """(observations [E, ...] in the spec's dtype, env states) of `num_envs` fresh episodes."""
  observation, env_state = jax.vmap(env.reset)(jax.random.split(key, num_envs))
  return observation.astype(env.spec.observations.dtype), env_state


def chunk_metrics(state, stats: StepStats, metric_sums, learned, epsilon_fn
                  ) -> Dict[str, chex.Array]:
  """A chunk's row: learner metrics averaged over the `learned` iterations that learned (their
  `metric_sums` over those; NaN if none did), the episode `stats` summed, and the counters."""
  out: Dict[str, chex.Array] = jax.tree.map(
      lambda m: jnp.where(learned > 0, m / jnp.maximum(learned, 1.0), jnp.nan), metric_sums)
  out["episode_return_sum"] = stats.return_sum
  out["episodes"] = stats.episodes
  out["epsilon"] = jnp.mean(epsilon_fn(state.env_steps))
  out["env_steps"] = state.env_steps
  out["learner_steps"] = state.learner.steps
  out["nonfinite_updates"] = state.learner.nonfinite_updates
  out["first_nonfinite_step"] = state.learner.first_nonfinite_step
  return out


def make_evaluate(env: GymnaxEnv, eval_policy: PolicyFn, eval_episodes: int,
                  eval_epsilon: float = 0.0):
  """`evaluate(params, key)`: `eval_episodes` episodes in parallel until each has ended once
  (or the time limit); returns their returns."""
  greedy_epsilon = np.float32(eval_epsilon)  # A constant of the trace: nothing runs here.

  def evaluate(online_params, key):
    reset_key, key = jax.random.split(key)
    observation, env_state = reset_copies(env, reset_key, eval_episodes)
    zeros = jnp.zeros((eval_episodes,), jnp.float32)
    carry = (observation, env_state, zeros, jnp.zeros((eval_episodes,), jnp.bool_),
             jnp.zeros((), jnp.int32), key)

    def not_done(carry):
      return jnp.logical_and(~jnp.all(carry[3]), carry[4] < env.max_episode_steps)

    def body(carry):
      observation, env_state, returns, done, t, key = carry
      key, act_key, env_keys = split_step_keys(key, eval_episodes)
      action = eval_policy(online_params, act_key, observation, greedy_epsilon)
      observation, env_state, reward, terminated, truncated, _ = jax.vmap(env.step)(
          env_keys, env_state, action)
      returns = returns + jnp.where(done, 0.0, reward.astype(jnp.float32))
      done = done | terminated | truncated
      return observation, env_state, returns, done, t + 1, key

    return jax.lax.while_loop(not_done, body, carry)[2]

  return evaluate
