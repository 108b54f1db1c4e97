"""`run_experiment`: checks the run's input, sets up JAX, and runs the mode's source in the run loop.

Bad input is refused here, before anything compiles: output directories
that cannot be written, a new run's checkpoint directory that holds
another run's checkpoints, a resumed run's that holds none (ConfigError or
CheckpointError naming the field).
"""

import time
from typing import Any, Dict, Optional, Tuple, Type

from acme_jax_dqn import callbacks as callbacks_lib
from acme_jax_dqn import loggers
from acme_jax_dqn import xla_setup
from agents.dqn import checkpoints
from agents.dqn import run_loop
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.experiment_config import ExperimentConfig

__all__ = ["ExperimentConfig", "cpu_threads", "run_experiment", "set_anakin_cpu_devices",
           "set_up_cpu_client", "source_type", "train"]


def source_type(experiment: ExperimentConfig, config: DQNConfig) -> Type[run_loop.Source]:
  """The run mode's source class, its libraries imported (the environment adapters; rlax where
  this process learns; in anakin mode also the environment's JAX library): each mode imports
  only its own (the distributed driver does not learn: its learner node imports rlax).
  Called with (experiment, config), the class builds the source (in anakin mode it compiles
  the program)."""
  if config.pqn and experiment.run_mode == "distributed":
    raise ConfigError(
        "`pqn`=True with `run_mode`=distributed: PQN learns from each rollout once, with the "
        "parameters that collected it, so Ray actors acting on older parameters would make "
        "its Q(lambda) targets off-policy. Use `run_mode`=anakin (gymnax) or local.")
  if experiment.run_mode != "distributed":  # It learns in this process: rlax, for its losses.
    from acme_jax_dqn import losses  # pylint: disable=import-outside-toplevel,unused-import
  if experiment.run_mode == "anakin":
    from acme_jax_dqn import envs  # pylint: disable=import-outside-toplevel
    from agents.dqn.anakin import AnakinSource  # pylint: disable=import-outside-toplevel
    envs.import_jax_library(experiment.env)
    return AnakinSource
  if experiment.run_mode == "distributed":
    # Ray itself is imported where it is started (agents/dqn/ray_cluster.py), within compile_s.
    from agents.dqn.distributed import DistributedSource  # pylint: disable=import-outside-toplevel
    return DistributedSource
  from agents.dqn.local_run import LocalSource  # pylint: disable=import-outside-toplevel
  return LocalSource


def set_anakin_cpu_devices(experiment: ExperimentConfig) -> bool:
  """Gives the CPU client a device per seed (up to `xla_setup.MAX_AUTO_CPU_DEVICES`, or
  `cpu_devices` when more; a resume may need its checkpoint's split); agents/dqn/anakin.py
  picks how many the seeds split over. Call before the CPU client exists."""
  return xla_setup.set_cpu_devices(max(experiment.cpu_devices,
                                       min(experiment.num_seeds, xla_setup.MAX_AUTO_CPU_DEVICES)))


def cpu_threads(experiment: ExperimentConfig, config: DQNConfig) -> int:
  """The XLA CPU worker threads the run asks for: `cpu_threads`, or where it is 0, one in
  local and anakin mode with an MLP torso and 0 (XLA's default) otherwise. Decided before the
  client exists, so before the environment gives its observations: an "auto" torso counts as
  an MLP where the environment's name surely gives vectors (`envs.gives_vectors`)."""
  if experiment.cpu_threads or experiment.run_mode == "distributed":
    return experiment.cpu_threads
  if config.torso == "auto":
    from acme_jax_dqn import envs  # pylint: disable=import-outside-toplevel
    return 1 if envs.gives_vectors(experiment.env) else 0
  return 1 if config.torso == "mlp" else 0


def set_up_cpu_client(experiment: ExperimentConfig, config: DQNConfig) -> None:
  """The run's settings that JAX's CPU client reads when it is created (dispatch, devices,
  threads, one core), then the client; where it exists already, it stays as it is."""
  if experiment.run_mode == "local":  # JAX reads the dispatch setting at creation only.
    xla_setup.configure_cpu_dispatch(config.num_envs)
  if experiment.run_mode == "anakin":
    set_anakin_cpu_devices(experiment)
  if experiment.one_cpu_core:
    xla_setup.run_xla_on_one_cpu_core()
  threads = cpu_threads(experiment, config)
  blocked = threads and xla_setup.cpu_threads_blocked()
  if blocked and experiment.cpu_threads:  # The kit's own pick goes quietly.
    loggers.warn(f"`cpu_threads`={threads} is not applied: {blocked}.")
  elif threads:
    xla_setup.set_cpu_threads(threads)


def run_experiment(experiment: ExperimentConfig, config: DQNConfig,
                   callbacks: Optional[callbacks_lib.CallbackList] = None) -> Dict[str, Any]:
  """Trains in the experiment's run mode; writes train.csv, eval.csv and summary.json.

  Returns the summary (the contents of summary.json).
  """
  return train(experiment, config, callbacks)[0]


def train(experiment: ExperimentConfig, config: DQNConfig,
          callbacks: Optional[callbacks_lib.CallbackList] = None) -> Tuple[Dict[str, Any], Any]:
  """`run_experiment`, returning (summary, the final online parameters on the host)."""
  checkpoints.check_output_paths(experiment)
  xla_setup.enable_compilation_cache(experiment.compilation_cache_dir)
  set_up_cpu_client(experiment, config)  # Before orbax, whose checkpoint listing would start it.
  checkpoints.check_start(experiment, config)
  imports_start = time.perf_counter()
  make = source_type(experiment, config)  # Python imports, before compile_s's clock (`imports_s`).
  imports_s = time.perf_counter() - imports_start
  with xla_setup.prng_impl(experiment.prng_impl):  # Every key of the run, then back as it was.
    start = time.perf_counter()  # compile_s counts from here.
    loggers.preload(experiment.loggers)  # Imported while the program compiles.
    source = make(experiment, config)
    try:
      summary = run_loop.run(experiment, config, source, start, callbacks, imports_s)
      return summary, source.params()
    finally:
      source.close()
