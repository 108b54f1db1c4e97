"""DQN-family agents: `from agents.dqn import DQNBuilder, DQNConfig`.

The builder and the agent import JAX; they load on first use, so that the
configs (and a bad flag's error) come without it.
"""

import importlib

from agents.dqn.config import ConfigError, DQNConfig

__all__ = ["ConfigError", "DQNBuilder", "DQNConfig", "LocalAgent"]
_LAZY = {"DQNBuilder": "agents.dqn.builder", "LocalAgent": "agents.dqn.local"}


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'agents.dqn' has no attribute {name!r}")
