"""A JAX DQN Learner for RLlib: one jitted SGD step of the kit's loss object per train batch.

RLlib's DQN hands the learner n-step batches from its replay (`obs`,
`actions`, `rewards` summed over `n_step` discounted steps, `new_obs`,
`terminateds`, `n_step`, `weights`). The learner turns a batch into the
kit's `Transition` (bootstrap multiplier gamma ** n_step times 1 -
terminated) and takes the kit's `sgd_step` on it: `QLearningLoss`
(double Q, Huber or squared) or `CategoricalLoss` (C51), with the kit's
optimizer (global-norm clipping, then Adam) and its guard against
non-finite updates. RLlib's target cadence (`target_network_update_freq`
env steps, `tau`) moves the target with the kit's `target_updates.update_target`.
New TD errors go back to RLlib's prioritized replay.

RLlib 2.60 has Learner classes for torch only. This one overrides the
per-batch `_update` (RLlib's optimizer, gradient and tensor hooks are
never reached), and `JaxEnvRunner` is the one place that works around
the env runner's torch-only device lookup.
"""

from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np
import ray.rllib.env.single_agent_env_runner as single_agent_env_runner
from ray.rllib.algorithms.dqn.dqn_learner import DQNLearner
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.metrics import TD_ERROR_KEY

from acme_jax_dqn import learning
from acme_jax_dqn import target_updates
from acme_jax_dqn.replay import ReplaySample
from acme_jax_dqn.types import TrainingState, Transition
from agents.dqn.builder import DQNBuilder
from agents.rllib_dqn.catalog import kit_config
from agents.rllib_dqn.module import to_numpy

LOGGED = ("td_error_mean", "q_mean", "q_max", "q_min")  # Besides qf_loss.


def transitions_from_batch(batch: Dict[str, Any], gamma: float) -> Transition:
  """The kit's n-step `Transition`s from one of RLlib DQN's train batches."""
  count = len(batch[Columns.OBS])
  n_step = np.asarray(batch.get("n_step", np.ones(count)), np.float32)
  terminated = np.asarray(batch[Columns.TERMINATEDS], np.float32)
  return Transition(observation=np.asarray(batch[Columns.OBS], np.float32),
                    action=np.asarray(batch[Columns.ACTIONS], np.int32),
                    reward=np.asarray(batch[Columns.REWARDS], np.float32),
                    discount=(gamma ** n_step * (1.0 - terminated)).astype(np.float32),
                    next_observation=np.asarray(batch[Columns.NEXT_OBS], np.float32))


class JaxDQNLearner(DQNLearner):
  """RLlib's DQN learner with the kit's loss object, optimizer and target update."""

  framework = "jax"

  def build(self) -> None:
    self._kit: Dict[str, Any] = {}
    super().build()
    self._learner_connector.remove("NumpyToTensor")  # The batch stays numpy.

  def configure_optimizers_for_module(self, module_id, config=None) -> None:
    """The kit's optimizer and jitted SGD step for `module_id` (RLlib's optimizer is not used)."""
    config = config or self.config.get_config_for_module(module_id)
    module = self.module[module_id].unwrapped()
    kit = kit_config(module.model_config, config)
    builder = DQNBuilder(kit)
    optimizer = builder.make_optimizer()
    # The target moves on RLlib's cadence (`after_gradient_based_update`), not in the step.
    sgd_step = learning.make_sgd_step(module.networks, builder.make_loss(), optimizer, 0, 1.0,
                                      learning.gradient_norm_fn(kit.max_grad_norm))
    # The kit's priority post-processing: 0 for a non-finite TD error, plus epsilon.
    sample_step = learning.make_sample_step(sgd_step, kit.priority_epsilon)
    self._kit[module_id] = {
        "config": kit, "loss": builder.make_loss(), "networks": module.networks,
        "sample_step": jax.jit(sample_step),
        "state": {"opt_state": to_numpy(optimizer.init(module.params)), "steps": 0,
                  "nonfinite_updates": 0, "first_nonfinite_step": -1}}

  def _training_state(self, module_id) -> TrainingState:
    module, state = self.module[module_id].unwrapped(), self._kit[module_id]["state"]
    return TrainingState(module.params, module.target_params, state["opt_state"],
                         np.int32(state["steps"]), np.asarray(module.key),
                         np.int32(state["nonfinite_updates"]),
                         np.int32(state["first_nonfinite_step"]))

  def compute_loss_for_module(self, *, module_id, config, batch, fwd_out=None):
    """The kit's loss object on `batch` at the module's parameters (what `_update` descends)."""
    del fwd_out
    kit, module = self._kit[module_id], self.module[module_id].unwrapped()
    transitions = transitions_from_batch(batch, config.gamma)
    weights = np.asarray(batch.get("weights", np.ones(len(transitions.action))), np.float32)
    loss, _ = kit["loss"](kit["networks"].apply, module.params, module.target_params,
                          transitions, weights)
    return loss

  def _update(self, batch: Dict[str, Any], **kwargs):
    """One SGD step per module on its batch; logs the loss, TD errors and Q statistics."""
    del kwargs
    loss_per_module = {}
    for module_id, module_batch in batch.items():
      kit, module = self._kit[module_id], self.module[module_id].unwrapped()
      transitions = transitions_from_batch(module_batch, kit["config"].discount)
      count = len(transitions.action)
      weights = np.asarray(module_batch.get("weights", np.ones(count)), np.float32)
      sample = ReplaySample(transitions, np.zeros(count, np.int32), weights,
                            np.ones(count, np.float32))
      state, metrics, priorities = kit["sample_step"](self._training_state(module_id), sample)
      state, metrics = to_numpy(state), to_numpy(metrics)
      module.params = state.online_params
      kit["state"] = {"opt_state": state.opt_state, "steps": int(state.steps),
                      "nonfinite_updates": int(state.nonfinite_updates),
                      "first_nonfinite_step": int(state.first_nonfinite_step)}
      loss_per_module[module_id] = float(metrics["loss"])
      # New priorities for RLlib's prioritized replay: |TD error| (C51: the cross-entropy).
      self.metrics.log_value((module_id, TD_ERROR_KEY), np.asarray(priorities),
                             reduce="item_series")
      self.metrics.log_dict({"qf_loss": float(metrics["loss"]),
                             "qf_mean": float(metrics["q_mean"]),
                             **{name: float(metrics[name]) for name in LOGGED},
                             "nonfinite_updates": kit["state"]["nonfinite_updates"]},
                            key=module_id, window=1)
    return {}, loss_per_module, {}

  def after_gradient_based_update(self, *, timesteps) -> None:
    """RLlib's target cadence; when it fires, the kit's `update_target` moves the target."""
    before = dict(self.last_update_ts_by_mid)
    super().after_gradient_based_update(timesteps=timesteps)  # Counts and logs the update.
    for module_id, last in self.last_update_ts_by_mid.items():
      if last != before.get(module_id, 0):  # RLlib's defaultdict starts each module at 0.
        module = self.module[module_id].unwrapped()
        tau = self.config.get_config_for_module(module_id).tau
        module.target_params = to_numpy(target_updates.update_target(
            module.params, module.target_params, jnp.int32(1), 1, tau))

  def _get_optimizer_state(self) -> Dict[str, Any]:
    return {module_id: kit["state"] for module_id, kit in self._kit.items()}

  def _set_optimizer_state(self, state: Dict[str, Any]) -> None:
    for module_id, module_state in state.items():
      self._kit[module_id]["state"] = module_state

  # RLlib's gradient and tensor hooks: never reached, as `_update` is the kit's step.
  def compute_gradients(self, loss_per_module, **kwargs):
    raise RuntimeError("JaxDQNLearner takes its gradients inside the kit's sgd_step.")

  def apply_gradients(self, gradients_dict):
    raise RuntimeError("JaxDQNLearner applies its updates inside the kit's sgd_step.")

  def get_param_ref(self, param):
    return id(param)

  def get_parameters(self, module):
    return jax.tree.leaves(module.params)

  def _convert_batch_type(self, batch, **kwargs):
    return batch

  def _get_tensor_variable(self, value, dtype=None, trainable=False):
    return np.asarray(value, dtype=dtype)

  @staticmethod
  def _get_optimizer_lr(optimizer):
    return 0.0

  @staticmethod
  def _set_optimizer_lr(optimizer, lr):
    del optimizer, lr

  @staticmethod
  def _get_clip_function():
    return None

  @staticmethod
  def _get_global_norm_function():
    return None


class JaxEnvRunner(SingleAgentEnvRunner):
  """RLlib's single-agent env runner for a JAX module.

  Two torch-only steps of RLlib 2.60 are worked around here, in one place:
  `SingleAgentEnvRunner.__init__` asks `get_device` for a torch device
  (NotImplementedError for any other framework, see
  tests/agents/test_rllib_dqn.py), and the default env-to-module pipeline
  ends in `NumpyToTensor`, which refuses a module that is not torch. Each
  runner also folds its index into the module's exploration key, so
  runners explore apart.
  """

  def __init__(self, *args, **kwargs):
    get_device = single_agent_env_runner.get_device
    single_agent_env_runner.get_device = lambda *a, **k: None  # No torch device to find.
    try:
      super().__init__(*args, **kwargs)
    finally:
      single_agent_env_runner.get_device = get_device
    self._env_to_module.remove("NumpyToTensor")
    if getattr(self, "module", None) is not None:
      self.module.key = np.asarray(jax.random.fold_in(self.module.key, self.worker_index))
