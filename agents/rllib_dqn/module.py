"""A JAX DQN RLModule for RLlib: the kit's Haiku network, its epsilon-greedy policy, numpy in and out.

The module's state is the online parameters, the target parameters and a
JAX PRNG key (exploration), as numpy. RLlib's DQN learner and replay
ask for `QNetAPI` (`compute_q_values`) and `TargetNetworkAPI`
(`forward_target`); target updates are the learner's (the kit's
`target_updates.update_target`), so `get_target_network_pairs` is empty.
"""

from typing import Any, Dict

import jax
import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.rl_module import RLModule

from acme_jax_dqn import actors
from agents.rllib_dqn.catalog import JaxDQNCatalog

QF_PREDS = "qf_preds"  # RLlib DQN's column names for Q-values and C51 outputs.
ATOMS, QF_LOGITS, QF_PROBS = "atoms", "qf_logits", "qf_probs"


def to_numpy(tree):
  return jax.tree.map(np.asarray, tree)


class JaxDQNModule(RLModule, QNetAPI, TargetNetworkAPI):
  """RLlib's DQN module interface around the kit's Q-network (`JaxDQNCatalog`)."""

  framework = "jax"

  def setup(self):
    catalog = JaxDQNCatalog(self.observation_space, self.action_space, self.model_config)
    self.kit_config = catalog.config
    self.networks = networks = catalog.build_networks()
    seed = int(self.model_config.get("seed", 0))
    init_key, self.key = jax.random.split(jax.random.PRNGKey(seed))
    self.params = to_numpy(jax.jit(networks.init)(init_key))
    self.target_params = None
    epsilon = self.model_config.get("epsilon", [(0, 1.0), (10000, 0.05)])
    epsilon = [(0, epsilon)] if isinstance(epsilon, (int, float)) else list(epsilon)
    self._epsilon_steps = [float(t) for t, _ in epsilon]
    self._epsilon_values = [float(v) for _, v in epsilon]
    self._apply = jax.jit(networks.apply)
    policy = actors.make_epsilon_greedy_policy(networks)

    def act(params, key, observation, epsilon):
      key, act_key = jax.random.split(key)
      return policy(params, act_key, observation, epsilon), key

    self._act = jax.jit(act)

  def to(self, device):  # RLlib's env runner moves modules to a torch device.
    del device
    return self

  def epsilon(self, t: int) -> float:
    """RLlib's piecewise-linear epsilon schedule (`epsilon`) at lifetime env step `t`."""
    return float(np.interp(t, self._epsilon_steps, self._epsilon_values))

  # QNetAPI and TargetNetworkAPI.
  def _outputs(self, params, observation) -> Dict[str, Any]:
    out = self._apply(params, np.asarray(observation, np.float32))
    result = {QF_PREDS: np.asarray(out.q_values)}
    if out.logits is not None:
      result.update({ATOMS: np.asarray(out.atoms), QF_LOGITS: np.asarray(out.logits),
                     QF_PROBS: np.asarray(jax.nn.softmax(out.logits, axis=-1))})
    return result

  def compute_q_values(self, batch: Dict[str, Any]) -> Dict[str, Any]:
    return self._outputs(self.params, batch[Columns.OBS])

  def make_target_networks(self) -> None:
    self.target_params = jax.tree.map(np.copy, self.params)

  def get_target_network_pairs(self):
    return []  # The learner updates the target with the kit's `update_target`.

  def forward_target(self, batch: Dict[str, Any]) -> Dict[str, Any]:
    return self._outputs(self.target_params, batch[Columns.OBS])

  # Forward passes of the env runners (numpy in, numpy out).
  def _forward_inference(self, batch, **kwargs):
    q_values = self._outputs(self.params, batch[Columns.OBS])[QF_PREDS]
    return {Columns.ACTIONS: q_values.argmax(axis=-1)}

  def _forward_exploration(self, batch, t: int = 0, **kwargs):
    actions, self.key = self._act(self.params, self.key,
                                  np.asarray(batch[Columns.OBS], np.float32),
                                  np.float32(self.epsilon(t)))
    return {Columns.ACTIONS: np.asarray(actions)}

  def _forward_train(self, batch, **kwargs):
    raise RuntimeError("JaxDQNLearner computes the loss from the kit's loss object; "
                       "the module has no train forward pass.")

  # State: online params, target params and the exploration key.
  def get_state(self, components=None, *, not_components=None, inference_only=False,
                **kwargs) -> Dict[str, Any]:
    """The parameters; without `inference_only` (what RLlib sends its env runners, which
    keep their own exploration keys) also the target parameters and the key."""
    del components, not_components, kwargs
    state = {"params": to_numpy(self.params)}
    if not inference_only:
      state["key"] = np.asarray(self.key)
      if self.target_params is not None:
        state["target_params"] = to_numpy(self.target_params)
    return state

  def set_state(self, state: Dict[str, Any]) -> None:
    self.params = state["params"]
    if "target_params" in state:
      self.target_params = state["target_params"]
    if "key" in state:
      self.key = np.asarray(state["key"])
