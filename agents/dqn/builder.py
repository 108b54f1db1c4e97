"""DQNBuilder: the single seam that wires networks, loss, replay, adder, learner and actor."""

import math
import sys
from typing import Optional

import chex
import jax
import numpy as np
import optax

from acme_jax_dqn import actors
from acme_jax_dqn import anakin
from acme_jax_dqn import anakin_pqn
from acme_jax_dqn import adders
from acme_jax_dqn import learning
from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import pqn
from acme_jax_dqn import rate_limiting
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup
from acme_jax_dqn.envs.gymnax_adapter import GymnaxEnv
from acme_jax_dqn.types import Transition
from agents.dqn.config import SMALLER_NETWORK, ConfigError, DQNConfig


class DQNBuilder:
  """Makes every component of a DQN-family agent from one `DQNConfig` (Acme's builder role).

  The pure pieces (`make_sgd_step`, `make_learner_step`, `make_policy`)
  serve every run mode; the objects (`make_learner`, `make_actor`,
  `make_replay_buffer`, `make_adder`, `make_rate_limiter`) serve the
  Python-driven loops: the local agent and the distributed nodes.
  """

  def __init__(self, config: DQNConfig):
    self.config = config

  # Pure parts.
  def make_networks(self, spec: specs.EnvironmentSpec,
                    env_name: str = "") -> networks_lib.Networks:
    c = self.config
    if c.fused_loss:  # Before anything is built: what the kernel cannot take, in one line.
      from acme_jax_dqn import fused_loss  # pylint: disable=import-outside-toplevel  # As below.
      fused_loss.check_input(spec, c.torso, c.hidden_sizes, c.batch_size, c.double_q,
                             c.huber_delta, env_name)
    return networks_lib.make_networks(
        spec, hidden_sizes=c.hidden_sizes, dueling=c.dueling,
        distributional=c.distributional, num_atoms=c.num_atoms,
        v_min=c.v_min, v_max=c.v_max, torso=c.torso, quantile=c.quantile,
        num_quantiles=c.num_quantiles, layer_norm=c.layer_norm, noisy=c.noisy,
        noisy_torso=c.noisy_torso, noisy_sigma0=c.noisy_sigma0, iqn=c.iqn,
        iqn_num_cosines=c.iqn_num_cosines, iqn_num_policy_taus=c.iqn_num_policy_taus,
        env_name=env_name, conv_impl=c.conv_impl)

  def make_loss(self):
    """The variant's loss object: C51, QR-DQN, IQN, M-IQN, Munchausen, PQN's or (double) Q-learning."""
    # Here: rlax, with distrax and TFP (0.8 s of CPU), is imported by learning processes alone.
    from acme_jax_dqn import fused_loss, losses  # pylint: disable=import-outside-toplevel
    c = self.config
    if c.pqn:
      return losses.ReturnRegressionLoss(huber_delta=c.huber_delta)
    if c.distributional:
      return losses.CategoricalLoss(double_q=c.double_q)
    if c.quantile:
      return losses.QuantileLoss(double_q=c.double_q, huber_kappa=c.quantile_huber_kappa)
    if c.iqn and c.munchausen:
      return losses.MunchausenImplicitQuantileLoss(
          num_taus=c.iqn_num_taus, num_target_taus=c.iqn_num_target_taus,
          num_policy_taus=c.iqn_num_policy_taus, alpha=c.munchausen_alpha,
          tau=c.munchausen_tau, clip_min=c.munchausen_clip, huber_kappa=c.quantile_huber_kappa)
    if c.iqn:
      return losses.ImplicitQuantileLoss(
          num_taus=c.iqn_num_taus, num_target_taus=c.iqn_num_target_taus, double_q=c.double_q,
          num_policy_taus=c.iqn_num_policy_taus, huber_kappa=c.quantile_huber_kappa)
    if c.munchausen:
      return losses.MunchausenLoss(alpha=c.munchausen_alpha, tau=c.munchausen_tau,
                                   clip_min=c.munchausen_clip, huber_delta=c.huber_delta)
    q_loss = fused_loss.FusedQLearningLoss if c.fused_loss else losses.QLearningLoss
    return q_loss(double_q=c.double_q, huber_delta=c.huber_delta)

  def make_optimizer(self) -> optax.GradientTransformation:
    c = self.config
    learning_rate = learning.make_learning_rate(
        c.learning_rate, c.learning_rate_schedule, c.learning_rate_decay_steps,
        c.learning_rate_end)
    return learning.make_optimizer(learning_rate, c.max_grad_norm, c.adam_eps,
                                   c.gradient_accumulation_steps)

  def make_replay(self, packed_example: Optional[Transition] = None) -> replay_lib.Replay:
    c = self.config  # With `packed_example`: items stored packed (`replay.PackedItems`).
    return replay_lib.make_replay(c.replay_capacity, c.batch_size, c.prioritized,
                                  c.priority_exponent, packed_example)

  def make_sgd_step(self, networks: networks_lib.Networks,
                    optimizer: Optional[optax.GradientTransformation] = None):
    c = self.config
    return learning.make_sgd_step(networks, self.make_loss(),
                                  optimizer or self.make_optimizer(),
                                  0 if c.pqn else c.target_update_period, c.target_update_tau,
                                  learning.gradient_norm_fn(c.max_grad_norm))

  def importance_sampling_schedule(self) -> optax.Schedule:
    c = self.config
    if c.importance_sampling_anneal_steps <= 0:
      return optax.constant_schedule(c.importance_sampling_exponent)
    return optax.linear_schedule(c.importance_sampling_exponent,
                                 c.importance_sampling_exponent_end,
                                 c.importance_sampling_anneal_steps)

  def make_learner_step(self, networks: networks_lib.Networks, replay: replay_lib.Replay,
                        optimizer: Optional[optax.GradientTransformation] = None):
    """`(state, buffer) -> (state, buffer, metrics)`; PQN's buffer is a rollout [T, E]."""
    c = self.config
    if c.pqn:
      return pqn.make_rollout_update(networks, self.make_sgd_step(networks, optimizer),
                                     c.discount, c.pqn_lambda, c.pqn_epochs, c.pqn_minibatches)
    return learning.make_learner_step(
        self.make_sgd_step(networks, optimizer), replay, c.num_sgd_steps_per_step,
        self.importance_sampling_schedule(), c.priority_epsilon)

  def make_batches_learner_step(self, networks: networks_lib.Networks,
                                optimizer: Optional[optax.GradientTransformation] = None):
    """One learner call on `num_sgd_steps_per_step` batches sampled elsewhere (the replay node)."""
    return learning.make_batches_step(self.make_sgd_step(networks, optimizer),
                                      self.config.priority_epsilon)

  def importance_sampling_exponent(self, sgd_steps: int) -> float:
    """The PER exponent after `sgd_steps` SGD steps (the schedule counts applied updates)."""
    applied = sgd_steps // self.config.gradient_accumulation_steps
    return float(self.importance_sampling_schedule()(applied))

  def learner_calls_due(self, inserted: int) -> int:
    """Learner calls the samples-per-insert rule allows after `inserted` replay items (PQN:
    one call per complete rollout, `inserted` counting its steps)."""
    c = self.config
    if c.pqn:
      return inserted // (c.pqn_rollout_len * c.num_envs)
    return rate_limiting.calls_due(inserted, c.min_replay_size, c.samples_per_insert,
                                   c.samples_per_learner_step)

  def make_rate_limiter(self, num_actors: int,
                        insert_batch: int) -> rate_limiting.SampleToInsertRatio:
    """The distributed replay's limiter: the same rule, with room for what is in flight.

    Raises ConfigError when the replay cannot hold `min_replay_size` plus one
    batch in flight from every actor.
    """
    c = self.config
    needed = c.min_replay_size + insert_batch * num_actors
    if c.replay_capacity < needed:
      raise ConfigError(
          f"`replay_capacity`={c.replay_capacity} is too small for the rate limiter: it "
          f"must hold `min_replay_size`={c.min_replay_size} plus one batch of "
          f"`actor_insert_batch`={insert_batch} transitions from each of `num_actors`="
          f"{num_actors} actors ({needed}). Raise `replay_capacity` or lower the others.")
    return rate_limiting.SampleToInsertRatio(
        c.samples_per_insert, c.min_replay_size,
        rate_limiting.error_buffer(c.samples_per_learner_step, c.samples_per_insert,
                                   num_actors, insert_batch))

  def make_policy(self, networks: networks_lib.Networks,
                  evaluation: bool = False) -> actors.PolicyFn:
    """The pure epsilon-greedy policy (noisy networks: noise per call unless `evaluation`)."""
    return actors.make_epsilon_greedy_policy(networks, evaluation)

  def make_epsilon_schedule(self, evaluation: bool = False, num_envs: int = 1,
                            actor_index: int = 0, num_actors: int = 1):
    """Actor env steps -> epsilon, with one meaning per flag in every run mode.

    `epsilon_decay_steps` counts the run's env steps: an actor that is one of
    `num_actors` (distributed mode, stepping at about the same rate) decays
    over `epsilon_decay_steps / num_actors` of its own steps.
    `apex_epsilons` gives every env copy of the run its fixed epsilon: the
    copies of actor `actor_index` take their `num_envs` values of the
    `num_actors * num_envs` Ape-X epsilons.
    """
    c = self.config
    if evaluation:
      return actors.make_epsilon_schedule(c.eval_epsilon, c.eval_epsilon, 0)
    if c.apex_epsilons:
      run_epsilons = actors.apex_epsilons(num_actors * num_envs, c.apex_epsilon_base,
                                          c.apex_epsilon_alpha)
      mine = run_epsilons[actor_index * num_envs:(actor_index + 1) * num_envs]
      if num_envs == 1:  # One copy: a scalar epsilon.
        return actors.make_epsilon_schedule(float(mine[0]), float(mine[0]), 0)
      return actors.ConstantEpsilons(mine)
    return actors.make_epsilon_schedule(c.epsilon_start, c.epsilon_end,
                                        c.epsilon_decay_steps / num_actors)

  def make_anakin(self, env: GymnaxEnv, networks: networks_lib.Networks,
                  eval_episodes: int = 10, packed_items: bool = True) -> anakin.Anakin:
    """The compiled trainer for a JAX environment, from the same pure parts (replay items
    stored packed, `replay.PackedItems`, unless `packed_items` is off: the same values)."""
    c = self.config
    optimizer = self.make_optimizer()
    if c.pqn:
      return anakin_pqn.make_pqn_anakin(
          env, networks, optimizer, self.make_learner_step(networks, None, optimizer),
          self.make_policy(networks), self.make_epsilon_schedule(num_envs=c.num_envs),
          num_envs=c.num_envs, rollout_len=c.pqn_rollout_len, eval_episodes=eval_episodes,
          eval_epsilon=c.eval_epsilon, reward_clip=c.reward_clip,
          eval_policy=self.make_policy(networks, evaluation=True))
    example = self.example_transition(env.spec)
    replay = self.make_replay(example if packed_items else None)
    env_steps, learner_calls = rate_limiting.iteration_shape(
        c.samples_per_learner_step, c.samples_per_insert, c.num_envs)
    return anakin.make_anakin(
        env, networks, optimizer, self.make_learner_step(networks, replay, optimizer),
        replay, self.make_policy(networks), self.make_epsilon_schedule(num_envs=c.num_envs),
        example, num_envs=c.num_envs, n_step=c.n_step, discount=c.discount,
        min_replay_size=c.min_replay_size, env_steps_per_iteration=env_steps,
        learner_calls_per_iteration=learner_calls, eval_episodes=eval_episodes,
        eval_epsilon=c.eval_epsilon, reward_clip=c.reward_clip,
        eval_policy=self.make_policy(networks, evaluation=True))

  # Objects for Python-driven loops.
  def example_transition(self, spec: specs.EnvironmentSpec) -> Transition:
    observation = np.zeros(spec.observations.shape, spec.observations.dtype)
    return Transition(observation=observation, action=np.int32(0),
                      reward=np.float32(0), discount=np.float32(0),
                      next_observation=observation)

  def make_replay_buffer(self, spec: specs.EnvironmentSpec,
                         replay: Optional[replay_lib.Replay] = None,
                         insert_chunk: Optional[int] = None) -> replay_lib.ReplayBuffer:
    """Host-fed replay; items enter the device buffer in chunks of `insert_chunk`.

    The default chunk is what one learner call's ratio asks for (local mode
    writes one chunk per learner call); a replay fed in batches (the
    distributed replay node) passes its batch size. PQN's is a `pqn.RolloutBuffer`.
    """
    if self.config.pqn:
      observation = np.zeros(spec.observations.shape, spec.observations.dtype)
      zeros = np.zeros((self.config.num_envs,), np.float32)
      example = pqn.RolloutStep(
          np.stack([observation] * self.config.num_envs), zeros.astype(np.int32), zeros,
          zeros, zeros, np.stack([observation] * self.config.num_envs), zeros)
      self.check_rollout_fits(example)
      return pqn.RolloutBuffer(example, self.config.pqn_rollout_len)
    replay = replay or self.make_replay()
    example = self.example_transition(spec)
    self.check_replay_fits(replay, example)
    return replay_lib.ReplayBuffer(replay, example,
                                   insert_chunk=insert_chunk or self.config.inserts_per_learner_step)

  def check_replay_fits(self, replay: replay_lib.Replay, example: Transition,
                        on_host: bool = False) -> int:
    """Refuses, before allocating it, a host-fed replay that its memory cannot hold; its bytes.

    The buffer lives on this process's default device (a CPU device: the
    host's memory), or with `on_host` in the host's memory, asked of the
    OS (the distributed driver's check, which starts no JAX backend). Its
    arrays come from `jax.eval_shape` of its init, so a capacity too large
    costs no allocation and no compile; the error names the largest
    capacity that fits (bytes do not grow in step with capacity: a
    prioritized replay's sum tree has a power-of-two size).
    """
    limit, holder = xla_setup.memory_for_buffers(on_host)
    total = xla_setup.nbytes(jax.eval_shape(replay.init, example))
    if not limit or total <= 0.9 * limit:
      return total
    c = self.config  # Smaller replays of the same kind, for the capacity that fits.
    # (flashbax builds no replay smaller than its batch; the size does not depend on it.)
    need = lambda capacity: xla_setup.nbytes(jax.eval_shape(replay_lib.make_replay(
        capacity, min(c.batch_size, capacity), replay.prioritized, c.priority_exponent).init,
        example))
    fits, over = 0, replay.capacity  # need(fits) fits (0: nothing), need(over) does not.
    while over - fits > 1:
      middle = (fits + over) // 2
      fits, over = (middle, over) if need(middle) <= 0.9 * limit else (fits, middle)
    above = [f"`{name}`" for name in ("batch_size", "min_replay_size", "num_envs")
             if getattr(c, name) > fits]  # DQNConfig asks the replay to hold these.
    batch = f", and {' and '.join(above)} no larger" if above else ""
    raise ConfigError(
        f"`replay_capacity`={replay.capacity}: the replay needs {total / 2**30:.1f} GiB "
        f"({xla_setup.nbytes(example):,} bytes per transition) and {holder} holds "
        f"{limit / 2**30:.1f} GiB. Use `replay_capacity` <= {fits}{batch}.")

  def check_rollout_fits(self, example: pqn.RolloutStep) -> None:
    """Refuses, before allocating it, a host-fed PQN rollout that memory cannot hold.

    `example` is one env step of every copy. The host holds a rollout's
    steps as staged (each step's arrays, as `sys.getsizeof` counts them)
    and stacked; the learner holds it once more on its device (on a CPU
    device, in the host's memory too).
    """
    c = self.config
    step = xla_setup.nbytes(example)
    device = jax.local_devices()[0]
    staged = sys.getsizeof(example) + sum(map(sys.getsizeof, example))
    host_step = staged + step  # Staged, then stacked.
    places = [("the host", xla_setup.host_memory_bytes(),
               host_step + step if device.platform == "cpu" else host_step)]
    if device.platform != "cpu":
      places.append(("the device", xla_setup.device_memory_bytes(device), step))
    # A length the minibatches still divide: a multiple of this.
    unit = c.pqn_minibatches // math.gcd(c.num_envs, c.pqn_minibatches)
    for holder, limit, per_step in places:
      if limit and c.pqn_rollout_len * per_step > 0.9 * limit:
        fits = int(0.9 * limit // per_step) // unit * unit
        use = (f"`pqn_rollout_len` <= {fits}, or fewer `num_envs`" if fits
               else "fewer `num_envs`")
        raise ConfigError(
            f"`pqn_rollout_len`={c.pqn_rollout_len}: a rollout of {c.num_envs} env copies "
            f"needs {c.pqn_rollout_len * per_step / 2**30:.1f} GiB of {holder}'s "
            f"{limit / 2**30:.1f} GiB ({per_step:,} bytes per step of every copy, staged, "
            f"stacked and learned from). Use {use}.")

  def make_adder(self, replay_buffer, num_envs: int = 1):
    """n-step transitions into `replay_buffer` (a `ReplayBuffer`, or any callable sink).

    PQN's adder writes every step to its `RolloutBuffer`.
    """
    sink = getattr(replay_buffer, "insert", replay_buffer)
    c = self.config
    if c.pqn:
      return pqn.RolloutAdder(sink, num_envs, reward_clip=c.reward_clip,
                              on_restart=getattr(replay_buffer, "cut", None))
    return adders.NStepTransitionAdder(sink, c.n_step, c.discount, num_envs,
                                       reward_clip=c.reward_clip)

  def check_learner_fits(self, networks: networks_lib.Networks, on_host: bool = False,
                         state=None, replay_bytes: int = 0, num_actors: int = 0) -> None:
    """Refuses, before allocating it, a learner whose network its memory cannot hold.

    Counted with `jax.eval_shape`: the learner's state (online and target
    parameters, the optimizer's state) and, while it learns, a gradient and
    an update the size of the parameters. The memory is as `check_replay_fits`
    says; the error names the largest parameter, which points at the flag. `state`: the
    state's shapes when the caller has them (`make_learner`'s trace of its init).
    Counted beside it, in the same memory: a replay of `replay_bytes` and, with
    `num_actors` (a distributed run whose nodes all share this host), the
    driver's two snapshots of the learner's state (the newest and the one it
    replaces) and a copy of the parameters in the variable server, the
    evaluator and each actor; named when the learner alone would fit.
    """
    if state is None:
      state = jax.eval_shape(lambda: learning.init_training_state(  # Starts no JAX backend.
          networks, self.make_optimizer(), jax.random.PRNGKey(0), not self.config.pqn))
    params, state_bytes = xla_setup.nbytes(state.online_params), xla_setup.nbytes(state)
    need = state_bytes + 2 * params
    nodes = (2 * state_bytes + 2 * params) if num_actors else 0  # Beside the actors' copies.
    limit, holder = xla_setup.memory_for_buffers(on_host)
    if not limit or need + replay_bytes + nodes + num_actors * params <= 0.9 * limit:
      return
    path, leaf = max(jax.tree_util.tree_leaves_with_path(state.online_params),
                     key=lambda item: item[1].size)
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    beside, fewer, parts = "", "", []
    others = nodes + num_actors * params
    # Named when the learner would fit alone: what is beside it (1% of the memory or more, or
    # all of it when each part is less) is the fix.
    least = 0.01 * limit if max(replay_bytes, others) >= 0.01 * limit else 1
    if need <= 0.9 * limit:
      if replay_bytes >= least:
        parts.append(f"the replay's {xla_setup.size_text(replay_bytes)}")
        fewer = ", or a smaller `replay_capacity`"
      if others >= least:
        parts.append(f"the other nodes' {xla_setup.size_text(others)} (the driver's two "
                     f"snapshots of the learner's state, and the parameters in the variable "
                     f"server, the evaluator and each of {num_actors} actors)")
        most = int((0.9 * limit - need - replay_bytes - nodes) // params)
        fewer += f", or `num_actors` <= {most}" if 1 <= most < num_actors else ""
      beside = f" beside {' and '.join(parts)}," if parts else ""
    raise ConfigError(
        f"The learner needs {need / 2**30:.1f} GiB (parameters {params / 2**30:.1f} GiB, "
        f"the largest {name} of shape {tuple(leaf.shape)}){beside} and {holder} holds "
        f"{limit / 2**30:.1f} GiB. Use {SMALLER_NETWORK}{fewer}.")

  def make_learner(self, networks: networks_lib.Networks,
                   replay_buffer: replay_lib.ReplayBuffer,
                   key: chex.PRNGKey) -> learning.Learner:
    optimizer = self.make_optimizer()
    # One compiled call instead of one small compilation per eager Haiku/optax op; its trace
    # (shapes only) is checked first, and the call reuses it.
    init = jax.jit(learning.init_training_state, static_argnums=(0, 1, 3))
    args = (networks, optimizer, key, not self.config.pqn)
    replay_bytes = (0 if self.config.pqn else  # The replay is on the same device.
                    xla_setup.nbytes(replay_buffer.state))
    self.check_learner_fits(networks, state=jax.eval_shape(init, *args),
                            replay_bytes=replay_bytes)
    state = init(*args)
    learner_step = self.make_learner_step(networks, replay_buffer.replay, optimizer)
    return learning.Learner(learner_step, replay_buffer, state)

  def make_actor(self, networks: networks_lib.Networks, variable_source,
                 key: chex.PRNGKey, adder=None, evaluation: bool = False,
                 num_envs: Optional[int] = None, actor_index: int = 0,
                 num_actors: int = 1) -> actors.Actor:
    """An actor over `num_envs` env copies (None: one, unbatched), reading `variable_source`.

    `actor_index` of `num_actors` picks its epsilons (see `make_epsilon_schedule`).
    """
    period = 1 if evaluation else self.config.variable_update_period
    client = actors.VariableClient(variable_source, "policy", period)
    epsilon_fn = self.make_epsilon_schedule(evaluation, num_envs or 1, actor_index, num_actors)
    return actors.Actor(actors.make_greedy_policy(networks, evaluation), epsilon_fn, client, key,
                        networks.num_actions, adder=adder, num_envs=num_envs)
