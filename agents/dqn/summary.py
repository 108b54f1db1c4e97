"""The files a run writes, field by field: summary.json and the train.csv / eval.csv rows.

Field names are a public contract (docs/summary_schema.md): fields are
added, never renamed or dropped.
"""

import dataclasses
import math
import os
from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np
import platform

from acme_jax_dqn import loggers
from acme_jax_dqn import networks as networks_lib
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup


def eval_row(env_steps: int, learner_steps: int, wall_s: float, returns,
             seeds: Optional[Sequence[int]] = None) -> Dict[str, Any]:
  """An eval.csv row from episode returns [episodes], or [seeds, episodes] with `seeds`.

  With `seeds` the row also has each seed's mean and the lowest of them;
  `eval_return_per_seed` (a list, kept for summary.json and checkpoints) is
  not written to eval.csv.
  """
  returns = np.asarray(returns, np.float64).reshape(len(seeds) if seeds else 1, -1)
  per_seed = returns.mean(axis=1)
  row = {"env_steps": env_steps, "learner_steps": learner_steps, "wall_s": wall_s,
         "eval_return_mean": float(per_seed.mean()),
         "eval_return_std": float(returns.std()),
         "eval_episodes": int(returns.shape[1])}
  if seeds:
    row.update(eval_return_min_seed=float(per_seed.min()),
               **{f"eval_return_seed{s}": float(r) for s, r in zip(seeds, per_seed)},
               eval_return_per_seed=per_seed.tolist())
  return row


def recent_mean(returns: Sequence[float], count: int = 20) -> float:
  """Mean of the last `count` episode returns (nan before the first episode ends)."""
  recent = list(returns)[-count:]
  return float(np.mean(recent)) if recent else math.nan


def base_summary(experiment, config, *, env_steps: int, learner_steps: int, wall_s: float,
                 compile_s: float, eval_s: float, final_eval: Dict[str, Any],
                 imports_s: float = 0.0,
                 spec: Optional[specs.EnvironmentSpec] = None,
                 steps_this_start: Optional[int] = None) -> Dict[str, Any]:
  """The summary.json fields every run mode writes.

  `sps` and `sps_after_compile` count the env steps of this process
  (`steps_this_start`, all of them unless the run was resumed).
  """
  steps = env_steps if steps_this_start is None else steps_this_start
  return {
      "env": experiment.env,
      "run_mode": experiment.run_mode,
      "seed": experiment.seed,
      "env_steps": env_steps,
      "learner_steps": learner_steps,
      "wall_s": wall_s,
      "compile_s": compile_s,
      "imports_s": imports_s,
      "eval_s": eval_s,
      "sps": steps / wall_s,
      "sps_after_compile": steps / (wall_s - compile_s),
      "env_steps_this_start": steps,
      "eval_return_mean": final_eval["eval_return_mean"],
      "eval_return_std": final_eval["eval_return_std"],
      "eval_episodes": final_eval["eval_episodes"],
      "config": dataclasses.asdict(config),
      "experiment": dataclasses.asdict(experiment),
      "versions": {"jax": jax.__version__, "python": platform.python_version()},
      "backend": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "prng_impl": experiment.prng_impl,
      "cpu_threads": xla_setup.cpu_threads_set(),
      **(network_summary(spec, config) if spec is not None else {}),
  }


def network_summary(spec: specs.EnvironmentSpec, config) -> Dict[str, Any]:
  """What the network was built for: observation shape and dtype, actions, the torso chosen."""
  shape = tuple(spec.observations.shape)
  return {"observation_shape": list(shape),
          "observation_dtype": np.dtype(spec.observations.dtype).name,
          "num_actions": int(spec.actions.num_values),
          "torso": networks_lib.choose_torso(shape, config.torso)}


def checkpoint_summary(run_checkpoints, resumed_from: Optional[int]) -> Dict[str, Any]:
  """Where the run's checkpoints are, the last one, and the time spent saving."""
  return {"resumed_from_step": resumed_from,
          "checkpoint_dir": run_checkpoints.directory if run_checkpoints.enabled else None,
          "last_checkpoint": run_checkpoints.last_path,
          "checkpoint_s": run_checkpoints.save_s,
          "completed": True}


def write_summary(logdir: str, summary: Dict[str, Any]) -> None:
  loggers.write_json_atomic(os.path.join(logdir, "summary.json"), summary)
