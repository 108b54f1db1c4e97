"""The catalog: the kit's Haiku Q-network for RLlib's observation and action spaces.

RLlib's DQN options that shape the network or the loss map onto the
kit's `DQNConfig` fields (`kit_config`); the network comes from the same
`DQNBuilder.make_networks` every run mode of the kit uses: an MLP torso
(the encoder) and a Q, dueling, C51 or dueling C51 head.
"""

from typing import Any, Mapping, Optional

import gymnasium as gym
import numpy as np
from dm_env import specs as dm_specs

from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import specs
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig

DEFAULT_HIDDENS = (256, 256)  # RLlib's default `fcnet_hiddens`.


def kit_config(model_config: Mapping[str, Any], algo_config: Optional[Any] = None) -> DQNConfig:
  """The kit's `DQNConfig` for RLlib's DQN options.

  From the module's `model_config`: `double_q`, `dueling`, `num_atoms`
  (more than 1 is C51, `distributional`), `v_min`, `v_max`, and the
  torso's layers `fcnet_hiddens` followed by RLlib's head layers
  `hiddens` (the kit's heads are one linear layer per stream, so RLlib's
  head layers become shared torso layers), with a LayerNorm before each
  ReLU under `fcnet_use_layernorm`. From the algorithm config,
  when given: `gamma`, `lr`, `grad_clip` (global norm), `adam_epsilon`
  and `td_error_loss_fn` ("huber" is a Huber loss with delta 1, "mse" the
  squared loss 0.5 * td**2).
  """
  hiddens = tuple(model_config.get("fcnet_hiddens") or DEFAULT_HIDDENS) + tuple(
      model_config.get("hiddens") or ())
  num_atoms = int(model_config.get("num_atoms", 1))
  fields = dict(double_q=bool(model_config.get("double_q", False)),
                dueling=bool(model_config.get("dueling", False)),
                distributional=num_atoms > 1, num_atoms=max(num_atoms, 2),
                v_min=float(model_config.get("v_min", -10.0)),
                v_max=float(model_config.get("v_max", 10.0)),
                hidden_sizes=hiddens, torso="mlp",
                layer_norm=bool(model_config.get("fcnet_use_layernorm", False)))
  if algo_config is not None:
    fields.update(discount=float(algo_config.gamma), learning_rate=float(algo_config.lr),
                  max_grad_norm=float(algo_config.grad_clip or 0.0),
                  adam_eps=float(algo_config.adam_epsilon),
                  huber_delta=1.0 if algo_config.td_error_loss_fn == "huber" else 0.0)
  return DQNConfig(**fields)


def environment_spec(observation_space: gym.Space, action_space: gym.Space) -> specs.EnvironmentSpec:
  """The kit's spec for RLlib's spaces; the action space must be Discrete."""
  if not isinstance(action_space, gym.spaces.Discrete):
    raise ConfigError(f"action space {action_space}: the JAX DQN module needs a Discrete "
                      "action space (DQN picks one of n actions); use an environment with "
                      "discrete actions or another RLlib algorithm.")
  if not isinstance(observation_space, gym.spaces.Box):
    raise ConfigError(f"observation space {observation_space}: the JAX DQN module takes a Box "
                      "observation (flatten Dict or Tuple observations with a wrapper).")
  return specs.EnvironmentSpec(
      observations=dm_specs.Array(observation_space.shape, np.float32, "observation"),
      actions=dm_specs.DiscreteArray(int(action_space.n), name="action"),
      rewards=dm_specs.Array((), np.float32, "reward"),
      discounts=dm_specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"))


class JaxDQNCatalog:
  """Builds the kit's Q-network (encoder and head) from RLlib's spaces and model config."""

  def __init__(self, observation_space: gym.Space, action_space: gym.Space,
               model_config: Mapping[str, Any]):
    self.spec = environment_spec(observation_space, action_space)
    self.config = kit_config(model_config)

  def build_networks(self) -> networks_lib.Networks:
    return DQNBuilder(self.config).make_networks(self.spec)
