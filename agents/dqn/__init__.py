"""DQN-family agents: `from agents.dqn import DQNBuilder, DQNConfig`."""

from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.local import LocalAgent
