"""acme-jax-dqn: a DQN-family component kit for JAX in the style of Acme.

`acme_jax_dqn.learn(env_or_name, config, total_steps, key=..., callbacks=...)`
trains in one call (agents/dqn/functional.py); `acme_jax_dqn.Callback` is
the base class of its callbacks.
"""

from acme_jax_dqn.callbacks import Callback, CallbackError

__all__ = ["Callback", "CallbackError", "learn"]


def learn(*args, **kwargs):
  """`agents.dqn.functional.learn`: trains and returns (params, metrics); see its docstring."""
  from agents.dqn import functional  # pylint: disable=import-outside-toplevel
  return functional.learn(*args, **kwargs)
