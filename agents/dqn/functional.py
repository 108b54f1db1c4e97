"""`learn()`: training as one call, with callbacks, over the three run modes.

  import jax
  import acme_jax_dqn
  from agents.dqn import DQNConfig

  params, metrics = acme_jax_dqn.learn("gymnasium:CartPole-v1", DQNConfig(), 50_000,
                                       key=jax.random.PRNGKey(0))

It runs the same program as `python -m launch.run_dqn` (the run loop of
agents/dqn/run_loop.py, with its logs, checkpoints and summary.json) and
returns the final online parameters and the summary.
"""

import dataclasses
import tempfile
from typing import Any, Dict, NamedTuple, Optional, Sequence, Union

import jax
import numpy as np

from acme_jax_dqn import callbacks as callbacks_lib
from agents.dqn import experiment as experiment_lib
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.experiment_config import RUN_MODES, ExperimentConfig


class LearnResult(NamedTuple):
  """What `learn` returns (it unpacks as `params, metrics`).

  Attributes:
    params: the final online parameters (numpy leaves; in anakin mode
      stacked over the seeds on a leading axis, of size 1 for one seed).
    metrics: the run's summary, as written to `<logdir>/summary.json`
      (`eval_return_mean`, `env_steps`, `stopped_early`, `logdir`, ...).
  """
  params: Any
  metrics: Dict[str, Any]


def env_name(env_or_name) -> str:
  """The kit's `prefix:id` name of `env_or_name`: a name, or a registered gymnasium env."""
  if isinstance(env_or_name, str):
    return env_or_name
  env_id = getattr(getattr(env_or_name, "spec", None), "id", None)
  if env_id and hasattr(env_or_name, "unwrapped"):  # A gymnasium env from gymnasium.make.
    return f"gymnasium:{env_id}"  # Remade by its id: one copy per env copy and for evaluation.
  raise ConfigError(
      f"`env_or_name`={env_or_name!r}: pass an environment name such as "
      "'gymnasium:CartPole-v1' or 'gymnax:CartPole-v1' (docs/environments.md lists the "
      "prefixes), or a gymnasium env made by gymnasium.make from a registered id.")


def seed_of(key) -> int:
  """The run's seed from `key`: an int, or a JAX key (`jax.random.PRNGKey(s)` gives s)."""
  if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
    if key < 0:
      raise ConfigError(f"`key`={key}: a seed must be 0 or positive.")
    return int(key)
  try:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    words = np.asarray(key, np.uint64).ravel()
  except (AttributeError, TypeError, ValueError) as error:
    raise ConfigError(f"`key`={key!r}: pass an int seed or a JAX PRNG key "
                      "(jax.random.PRNGKey(0)).") from error
  if words.size == 0 or not np.issubdtype(np.asarray(key).dtype, np.unsignedinteger):
    raise ConfigError(f"`key`={key!r}: pass an int seed or a JAX PRNG key "
                      "(jax.random.PRNGKey(0)).")
  return int(sum(int(w) << (32 * i) for i, w in enumerate(reversed(words))) % (2**31 - 1))


def learn(env_or_name, config: Union[DQNConfig, Dict[str, Any], None] = None,
          total_steps: int = 50_000, *, key=0,
          callbacks: Sequence[callbacks_lib.CallbackLike] = (), mode: str = "local",
          **experiment_fields) -> LearnResult:
  """Trains a DQN-family agent and returns (final params, final metrics).

  Args:
    env_or_name: an environment name (`gymnasium:CartPole-v1`,
      `gymnax:CartPole-v1` for anakin mode, ...) or a gymnasium env made
      from a registered id.
    config: a `DQNConfig` (or a dict of its fields): the variant and its
      hyperparameters. Default: `DQNConfig()`.
    total_steps: env steps to train for.
    key: an int seed or a JAX PRNG key; the same key gives the same run.
    callbacks: `acme_jax_dqn.Callback` objects or functions `fn(event,
      data)`; a hook that returns True stops training early
      (acme_jax_dqn/callbacks.py).
    mode: "local", "anakin" (a gymnax env, compiled) or "distributed" (Ray).
    **experiment_fields: any other `ExperimentConfig` field (`eval_every`,
      `num_seeds`, `logdir`, `save_checkpoints`, `quiet`, ...). Without
      `logdir` the run writes to a new temporary directory, named in
      `metrics["logdir"]`.

  Raises:
    ConfigError: bad input (one line naming the argument or field), before
      anything compiles.
    CallbackError: a callback raised; the run saved a checkpoint first.
  """
  if mode not in RUN_MODES:
    raise ConfigError(f"`mode`={mode!r}: must be one of {RUN_MODES}.")
  try:
    hooks = callbacks_lib.CallbackList(callbacks)
  except TypeError as error:
    raise ConfigError(str(error)) from None
  if config is None:
    config = DQNConfig()
  elif isinstance(config, dict):
    unknown = sorted(set(config) - {f.name for f in dataclasses.fields(DQNConfig)})
    if unknown:
      raise ConfigError(f"`config`: {', '.join(unknown)} is not a DQNConfig field.")
    config = DQNConfig(**config)
  elif not isinstance(config, DQNConfig):
    raise ConfigError(f"`config`={config!r}: pass a DQNConfig or a dict of its fields.")
  known = {f.name for f in dataclasses.fields(ExperimentConfig)}
  unknown = sorted(set(experiment_fields) - known)
  if unknown:
    raise ConfigError(f"`{unknown[0]}`: not an argument of learn() nor an ExperimentConfig "
                      f"field; the fields are {', '.join(sorted(known))}.")
  for name in ("env", "run_mode", "seed", "total_steps"):
    if name in experiment_fields:
      raise ConfigError(f"`{name}`: pass it as learn()'s own argument "
                        "(env_or_name, mode, key, total_steps).")
  logdir: Optional[str] = experiment_fields.pop("logdir", None)
  resuming = experiment_fields.get("resume")
  if resuming and not (logdir or experiment_fields.get("checkpoint_dir")):
    raise ConfigError("`resume`=True: pass the `logdir` (or `checkpoint_dir`) of the run to "
                      "continue; without one, learn() writes to a new temporary directory.")
  experiment = ExperimentConfig(
      env=env_name(env_or_name), run_mode=mode, total_steps=total_steps, seed=seed_of(key),
      logdir=logdir or tempfile.mkdtemp(prefix="acme_jax_dqn_learn_"), **experiment_fields)
  summary, params = experiment_lib.train(experiment, config, hooks)
  return LearnResult(params, {**summary, "logdir": experiment.logdir})
