"""RLlib's DQN algorithm with the kit's JAX networks, losses and target update (new API stack).

  from agents.rllib_dqn import JaxDQNConfig
  algo = JaxDQNConfig().environment("CartPole-v1").training(n_step=3).build_algo()

`pip install -e '.[rllib]'`. RLlib's env runners, replay buffers and
training loop run unchanged; acting and learning are JAX (no torch).
"""

from agents.rllib_dqn.catalog import JaxDQNCatalog, kit_config
from agents.rllib_dqn.config import JaxDQNConfig
from agents.rllib_dqn.learner import JaxDQNLearner, JaxEnvRunner
from agents.rllib_dqn.module import JaxDQNModule

__all__ = ["JaxDQNCatalog", "JaxDQNConfig", "JaxDQNLearner", "JaxDQNModule", "JaxEnvRunner",
           "kit_config"]
