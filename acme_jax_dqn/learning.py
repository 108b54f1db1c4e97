"""Learning: the optimiser, a pure `sgd_step`, target updates, and Acme's `Learner` shell."""

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from acme_jax_dqn import acme_interop
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import trees
from acme_jax_dqn import xla_setup
from acme_jax_dqn.choices import LR_SCHEDULES
from acme_jax_dqn.target_updates import traced_anew, update_target
from acme_jax_dqn.networks import Networks
from acme_jax_dqn.types import Params, TrainingState

Metrics = Dict[str, chex.Array]
SGDStepFn = Callable[[TrainingState, replay_lib.ReplaySample],
                     Tuple[TrainingState, Metrics]]
LearnerStepFn = Callable[[TrainingState, replay_lib.BufferState],
                         Tuple[TrainingState, replay_lib.BufferState, Metrics]]


def make_learning_rate(learning_rate: float, schedule: str = "constant",
                       decay_steps: int = 0, end_value: float = 0.0):
  """A float or an optax schedule over learner steps."""
  if schedule == "constant" or decay_steps <= 0:
    return learning_rate
  if schedule == "linear":
    return optax.linear_schedule(learning_rate, end_value, decay_steps)
  if schedule == "cosine":
    alpha = end_value / learning_rate if learning_rate else 0.0
    return optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=alpha)
  raise ValueError(f"Unknown learning-rate schedule {schedule!r}; "
                   f"choose one of {LR_SCHEDULES}.")


def gradient_norm_fn(max_grad_norm: float) -> Callable[[Any], chex.Array]:
  """The learner step's gradient norm (its non-finite guard, its `grad_norm` metric and the
  optimizer's clipping, to which the step hands it: `clip_by_global_norm`).

  With clipping (`max_grad_norm` > 0) it is `optax.tree.norm`, the expression
  `optax.clip_by_global_norm` takes, so a clipped run trains as with optax's
  clip to the bit. Without, it is `trees.global_norm`, one reduction over
  every leaf (on a GPU one kernel instead of one per leaf). The parameters
  do not depend on this choice without clipping; the metric agrees to float
  rounding.
  """
  return optax.tree.norm if max_grad_norm > 0 else trees.global_norm


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  """`optax.clip_by_global_norm`, taking the norm as the extra argument `grad_norm`.

  Below `max_norm` the updates pass unchanged, else each is divided by the
  norm and multiplied by `max_norm`, as optax does. The learner step has
  the gradient's norm already (`gradient_norm_fn`, or the fused loss's
  kernel, which sums the squares as it writes the gradient) and hands it
  in, so the clip reads no gradient for its own norm. Without `grad_norm`
  it takes `optax.tree.norm` of the updates, as optax does.
  """
  def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
    below = jnp.squeeze(norm < max_norm)
    return jax.tree.map(lambda t: jax.lax.select(below, t, t / norm.astype(t.dtype) * max_norm),
                        updates), state
  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def make_optimizer(learning_rate, max_grad_norm: float = 10.0,
                   adam_eps: float = 1e-8,
                   gradient_accumulation_steps: int = 1) -> optax.GradientTransformation:
  """Global-norm clipping (0 turns it off) then Adam, optionally accumulated over k steps."""
  parts = []
  if max_grad_norm > 0:
    parts.append(clip_by_global_norm(max_grad_norm))
  parts.append(optax.adam(learning_rate, eps=adam_eps))
  optimizer = optax.chain(*parts)
  if gradient_accumulation_steps > 1:
    optimizer = optax.MultiSteps(optimizer, every_k_schedule=gradient_accumulation_steps)
  return optimizer


def keep_if_finite(finite: chex.Array, new, old):
  """`new` where `finite`, else `old` (trees of the same structure).

  On the CPU a conditional that picks one of the two trees runs faster
  than an element-wise select over every leaf (measured with
  cartpole_anakin_purejaxrl.cfg, docs/benchmarks.md); on accelerators a
  conditional costs a round trip for its predicate, so they keep the
  select. Under vmap with a per-seed predicate both become a select.
  """
  if xla_setup.target_platform() == "cpu":
    return jax.lax.cond(finite, lambda n, o: n, lambda n, o: o, new, old)
  return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def applied_updates(state: TrainingState) -> chex.Array:
  """Updates applied to the online params: SGD steps, or k-step groups under accumulation.

  With `gradient_accumulation_steps` k > 1 the optimizer is an
  `optax.MultiSteps`, whose state counts the updates it applied; the
  learning-rate schedule, the target cadence and the PER beta schedule all
  count in these units. With k = 1 it is `state.steps`.
  """
  if isinstance(state.opt_state, optax.MultiStepsState):
    return state.opt_state.gradient_step
  return state.steps


def init_training_state(networks: Networks, optimizer: optax.GradientTransformation,
                        key: chex.PRNGKey, target_network: bool = True) -> TrainingState:
  """Online params from `key`; the target starts as an exact copy (without one: `()`)."""
  key, init_key = jax.random.split(key)
  online_params = networks.init(init_key)
  return TrainingState(
      online_params=online_params,
      target_params=jax.tree.map(jnp.copy, online_params) if target_network else (),
      opt_state=optimizer.init(online_params),
      steps=jnp.zeros((), jnp.int32),
      key=key,
      nonfinite_updates=jnp.zeros((), jnp.int32),
      first_nonfinite_step=jnp.full((), -1, jnp.int32))


def make_sgd_step(networks: Networks, loss_fn, optimizer: optax.GradientTransformation,
                  target_update_period: int, target_update_tau: float,
                  gradient_norm: Callable[[Any], chex.Array] = optax.tree.norm) -> SGDStepFn:
  """Returns the pure `sgd_step(state, batch) -> (state, metrics)`.

  `gradient_norm` takes the gradients' norm for the guard, the metric and
  the clip; a loss whose extras give the norm (`LossExtras.grad_squared_norm`)
  gives it instead. The optimizer gets it as the extra argument `grad_norm`
  (`clip_by_global_norm` takes it, other optax transformations ignore it),
  except under gradient accumulation, whose clip sees the mean of k steps.

  `batch` is a `ReplaySample` (transitions and importance weights). The
  metrics hold scalars plus `priorities` [B], the new replay priorities.
  `target_update_period` 0 means there is no target network (PQN): the
  state's `target_params` stay as they are (`()`).

  An update whose loss or gradient is not finite (a NaN reward, an
  overflow) is not applied: parameters, target and optimizer state stay as
  they were, `steps` still advances, and the state counts it
  (`nonfinite_updates`, `first_nonfinite_step`). Whether the run then stops
  or goes on is the host's choice (`skip_nonfinite_updates`); either way
  non-finite values never reach the parameters or a checkpoint. Items with
  a non-finite priority get priority 0, so prioritized replay stops drawing
  them.
  """

  def sgd_step(state: TrainingState, batch: replay_lib.ReplaySample):
    key = state.key
    if networks.stochastic:  # Fresh noise (or IQN fractions) for online and target, each step.
      key, online_noise, target_noise = jax.random.split(key, 3)

      def loss(online_params):  # Each network's params travel with its noise key.
        return loss_fn(lambda params_key, obs, **kwargs: networks.apply(
                           params_key[0], obs, params_key[1], **kwargs),
                       (online_params, online_noise), (state.target_params, target_noise),
                       batch.transitions, batch.weights, batch.mask)
    else:
      def loss(online_params):
        return loss_fn(networks.apply, online_params, state.target_params,
                       batch.transitions, batch.weights, batch.mask)

    (loss_value, extras), grads = jax.value_and_grad(loss, has_aux=True)(
        state.online_params)
    # Also the guard's test (a non-finite gradient) and the clip's norm. A loss that summed
    # the gradient's squares as it wrote it (the fused loss) spares a read of every gradient.
    grad_norm = (gradient_norm(grads) if extras.grad_squared_norm is None
                 else jnp.sqrt(extras.grad_squared_norm))
    if isinstance(state.opt_state, optax.MultiStepsState):  # Its clip sees k steps' mean.
      updates, opt_state = optimizer.update(grads, state.opt_state, state.online_params)
    else:
      updates, opt_state = optax.with_extra_args_support(optimizer).update(
          grads, state.opt_state, state.online_params, grad_norm=grad_norm)
    online_params = optax.apply_updates(state.online_params, updates)
    steps = state.steps + 1
    finite = jnp.isfinite(loss_value) & jnp.isfinite(grad_norm)
    online_params, opt_state = keep_if_finite(
        finite, (online_params, opt_state), (state.online_params, state.opt_state))
    if isinstance(opt_state, optax.MultiStepsState):  # Accumulating: k SGD steps an update.
      updates_so_far = opt_state.gradient_step
      applied = updates_so_far > state.opt_state.gradient_step
    else:
      updates_so_far, applied = steps, True
    target_params = state.target_params
    if target_update_period:
      target_params = update_target(online_params, target_params, updates_so_far,
                                    target_update_period, target_update_tau, applied)
    nonfinite_updates = state.nonfinite_updates + (~finite).astype(jnp.int32)
    first_nonfinite_step = jnp.where((state.first_nonfinite_step < 0) & ~finite,
                                     steps, state.first_nonfinite_step)
    metrics = {"loss": loss_value, "grad_norm": grad_norm, **extras.metrics,
               "priorities": extras.priorities}
    new_state = TrainingState(online_params, target_params, opt_state, steps, key,
                              nonfinite_updates, first_nonfinite_step)
    return new_state, metrics

  return sgd_step


def make_sample_step(sgd_step: SGDStepFn, priority_epsilon: float = 1e-6):
  """`(state, sample) -> (state, metrics, priorities)`: an SGD step and the sample's new priorities.

  Items drawn from empty slots (mask 0) keep priority 0, so they stay
  unsampleable; so do items whose TD error is not finite (see the guard in
  `sgd_step`). Every run mode writes these priorities back.
  """

  def step_on_sample(state: TrainingState, sample: replay_lib.ReplaySample):
    state, metrics = sgd_step(state, sample)
    priorities = metrics.pop("priorities")
    keep = (sample.mask > 0) & jnp.isfinite(priorities)
    metrics["importance_weight_mean"] = jnp.mean(sample.weights)
    return state, metrics, jnp.where(keep, priorities + priority_epsilon, 0.0)

  return step_on_sample


def make_batches_step(sgd_step: SGDStepFn, priority_epsilon: float = 1e-6):
  """`(state, samples [K, B, ...]) -> (state, mean metrics, priorities [K, B])`, one SGD step per batch.

  For a learner fed batches sampled elsewhere (the distributed replay node).
  """
  step_on_sample = make_sample_step(sgd_step, priority_epsilon)

  def batches_step(state: TrainingState, samples: replay_lib.ReplaySample):
    def body(state, sample):
      state, metrics, priorities = step_on_sample(state, sample)
      return state, (metrics, priorities)
    state, (metrics, priorities) = jax.lax.scan(body, state, samples)
    return state, jax.tree.map(jnp.mean, metrics), priorities

  return batches_step


def make_learner_step(sgd_step: SGDStepFn, replay: replay_lib.Replay,
                      num_sgd_steps: int = 1,
                      importance_sampling_exponent: Callable = lambda steps: 0.4,
                      priority_epsilon: float = 1e-6) -> LearnerStepFn:
  """Returns the pure `learner_step(state, buffer_state) -> (state, buffer_state, metrics)`.

  Each of the `num_sgd_steps` steps samples a batch, takes an SGD step and
  writes new priorities back; metrics are averaged over the steps. The
  importance-sampling exponent follows `applied_updates`.
  """

  step_on_sample = make_sample_step(sgd_step, priority_epsilon)

  def one_step(carry, _):
    state, buffer_state = carry
    sample, key = replay.sample_and_key(buffer_state, state.key,
                                        importance_sampling_exponent(applied_updates(state)))
    state, metrics, priorities = step_on_sample(state._replace(key=key), sample)
    buffer_state = replay.set_priorities(buffer_state, sample.indices, priorities)
    return (state, buffer_state), metrics

  def learner_step(state, buffer_state):
    if num_sgd_steps == 1:
      (state, buffer_state), metrics = one_step((state, buffer_state), None)
      return state, buffer_state, metrics
    (state, buffer_state), metrics = jax.lax.scan(
        traced_anew(one_step), (state, buffer_state), None, length=num_sgd_steps)
    return state, buffer_state, jax.tree.map(jnp.mean, metrics)

  return learner_step


class Learner:
  """Acme-style learner: holds the TrainingState and steps it on a replay buffer.

  `step()` is one jitted call: write the replay's oldest complete chunk,
  then `learner_step` (sample, SGD, new priorities). The state crosses the
  jit boundary packed into one array per dtype (see `trees.TreePacker`).
  The learner is also the `VariableSource` actors read parameters from.
  """

  def __init__(self, learner_step: LearnerStepFn, replay_buffer: replay_lib.ReplayBuffer,
               initial_state: TrainingState):
    self._replay_buffer = replay_buffer
    replay = replay_buffer.replay
    packer = trees.TreePacker(initial_state)
    self._packer = packer
    self._packed = jax.jit(packer.pack)(initial_state)
    self._metric_names: Tuple[str, ...] = ()
    self._metrics = None
    self._state_cache: Optional[TrainingState] = initial_state
    self._online_cache: Optional[Params] = initial_state.online_params

    def packed_step(packed, buffer_state):
      state, buffer_state, metrics = learner_step(packer.unpack(packed), buffer_state)
      self._metric_names, metrics = trees.pack_metrics(metrics)  # Names fixed at trace time.
      return packer.pack(state), buffer_state, metrics

    def packed_add_and_step(packed, buffer_state, chunk):
      return packed_step(packed, replay.add(buffer_state, chunk))

    # Packed state and buffer state are donated: only this object holds them.
    self._step_fn = jax.jit(packed_step, donate_argnums=(0, 1))
    self._add_and_step_fn = jax.jit(packed_add_and_step, donate_argnums=(0, 1))
    self._unpack_fn = jax.jit(packer.unpack)
    self._unpack_online_fn = jax.jit(lambda packed: packer.unpack(packed).online_params)

  def step(self) -> None:
    buffer = self._replay_buffer
    buffer.write_pending(keep=1)
    if buffer.pending_chunks:
      self._packed, buffer.state, self._metrics = self._add_and_step_fn(
          self._packed, buffer.state, buffer.pop_chunk())
    else:
      self._packed, buffer.state, self._metrics = self._step_fn(self._packed, buffer.state)
    self._state_cache = self._online_cache = None

  def warmup(self, with_plain_step: bool = True) -> None:
    """Compiles the jitted calls on copies of the state (nothing changes)."""
    copy = trees.copy_tree
    buffer = self._replay_buffer
    jax.block_until_ready(self._add_and_step_fn(
        copy(self._packed), copy(buffer.state), buffer.example_chunk()))
    if with_plain_step:
      jax.block_until_ready(self._step_fn(copy(self._packed), copy(buffer.state)))
    jax.block_until_ready(self._unpack_online_fn(self._packed))

  def run(self, num_steps: Optional[int] = None) -> None:
    """Acme's Worker.run: `step()` num_steps times (forever when None)."""
    iterator = range(num_steps) if num_steps is not None else itertools.count()
    for _ in iterator:
      self.step()

  def get_variables(self, names: Sequence[str] = ("policy",)) -> List[Params]:
    """Acme's VariableSource: every name is served the online parameters."""
    if self._online_cache is None:
      self._online_cache = self._unpack_online_fn(self._packed)
    return [self._online_cache for _ in names]

  def save(self) -> TrainingState:
    return self.state

  def restore(self, state: TrainingState) -> None:
    self._packed = self._packer.pack(state)
    self._state_cache, self._online_cache = state, state.online_params

  def get_metrics_state(self) -> Optional[np.ndarray]:
    """The last step's packed metrics (numpy), for checkpoints."""
    return None if self._metrics is None else np.asarray(self._metrics)

  def set_metrics_state(self, metrics: Optional[np.ndarray]) -> None:
    self._metrics = metrics

  @property
  def state(self) -> TrainingState:
    if self._state_cache is None:
      self._state_cache = self._unpack_fn(self._packed)
    return self._state_cache

  def metrics(self) -> Dict[str, float]:
    """The last step's scalar metrics on the host (NaN before the first step).

    Names are known once the step is traced (at `warmup` or the first step);
    before that the result is empty.
    """
    if self._metrics is None:
      return {name: float("nan") for name in self._metric_names}
    return dict(zip(self._metric_names, np.asarray(self._metrics).tolist()))


acme_interop.register(Learner, "Learner")
