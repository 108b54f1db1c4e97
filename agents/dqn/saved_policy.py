"""A saved agent's policy: parameters from a checkpoint, the network rebuilt from the run's config.

Used by `launch.evaluate` (episodes with the policy) and `launch.export`
(the greedy policy as a `jax.export` file).
"""

import jax
import numpy as np

from acme_jax_dqn import checkpointing, envs, specs
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig


def load_policy(checkpoint_dir: str, step=None, seed_index: int = 0, env_name=None,
                eval_epsilon: float = 0.0, env_seed: int = 0) -> dict:
  """A checkpoint's policy: its parameters and the network rebuilt from the run's config.

  Returns {"params", "networks", "builder", "config", "meta", "step", "env",
  "environment", "spec", "path", "num_seeds"}. Anakin checkpoints hold one
  set of parameters per seed; `seed_index` picks one.
  """
  checkpointer = checkpointing.Checkpointer(checkpoint_dir)
  params, meta, step = checkpointer.restore_params(step)
  checkpointer.close()
  num_seeds = int(meta.get("num_seeds", 1)) if meta.get("run_mode") == "anakin" else 1
  if meta.get("run_mode") == "anakin":
    if not 0 <= seed_index < num_seeds:
      raise ConfigError(f"`seed_index`={seed_index}: the checkpoint holds {num_seeds} "
                        f"seed(s); pick 0..{num_seeds - 1}.")
    params = jax.tree.map(lambda x: np.asarray(x)[seed_index], params)
  elif seed_index != 0:
    raise ConfigError(f"`seed_index`={seed_index}: the checkpoint of this {meta.get('run_mode')} "
                      "run holds one seed's parameters; drop `seed_index`.")
  config = DQNConfig(**{**meta["config"], "eval_epsilon": eval_epsilon})
  env_name = env_name or meta["experiment"]["env"]
  try:
    environment = envs.make_environment(env_name, seed=env_seed)
    spec = specs.make_environment_spec(environment)
    builder = DQNBuilder(config)
    networks = builder.make_networks(spec, env_name)
  except ValueError as error:
    raise ConfigError(str(error)) from error
  expected = jax.tree.map(np.shape, jax.eval_shape(networks.init, jax.random.PRNGKey(0)))
  if jax.tree.map(np.shape, params) != expected:
    raise checkpointing.CheckpointError(
        f"The parameters in {checkpointer.path(step)} do not fit a network for "
        f"{env_name} with the checkpoint's config; use the run's own environment "
        f"({meta['experiment']['env']}).")
  return {"params": params, "networks": networks, "builder": builder, "config": config,
          "meta": meta, "step": step, "env": env_name, "environment": environment,
          "spec": spec, "path": checkpointer.path(step), "num_seeds": num_seeds}
