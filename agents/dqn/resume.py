"""What a resumed run reads before it compiles (every run mode): its checkpoint, into the
shapes of the state its init would make, found with `jax.eval_shape` (a damaged or unfit
checkpoint then costs no compile, and in distributed mode no node); in anakin mode also the
checkpoint's compiled iteration and chunking, and there the checkpoint's state takes the place
of the init's.
"""

import os
from typing import Optional

import jax
from jax.sharding import PartitionSpec as P

from acme_jax_dqn import checkpointing
from acme_jax_dqn import learning
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup
from agents.dqn import checkpoints
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import DQNConfig
from agents.dqn.experiment_config import ExperimentConfig


def check_plan(experiment: ExperimentConfig, config: DQNConfig, plan) -> Optional[int]:
  """Raises CheckpointError when the newest checkpoint's iteration or chunking is not `plan`'s
  (an `agents.dqn.anakin.AnakinPlan`): one compiled chunk, the same budget (its run and state
  shapes: `checkpoints.check_start`). Returns how many devices its run split its seeds over
  (1 for checkpoints written before runs split them), or None when its metadata cannot be
  read."""
  run_checkpoints = checkpoints.RunCheckpoints(experiment, config)
  try:
    return _plan_differences(run_checkpoints, plan)
  finally:
    run_checkpoints.close()


def _plan_differences(run_checkpoints, plan) -> Optional[int]:
  """`check_plan` with the run's checkpoints open."""
  _, meta = run_checkpoints.newest()  # None: `check_start` refused the run, or the read
  if meta is None:  # sets the unreadable checkpoint aside.
    return None
  saved = meta.get("plan")
  shape = ("steps_per_iteration", "fill_env_steps")
  if saved is not None and any(saved[k] != plan.as_dict()[k] for k in shape):
    raise checkpointing.CheckpointError(
        f"`resume`: the checkpoint's run took {saved['steps_per_iteration']} env steps per "
        f"iteration after a fill of {saved['fill_env_steps']}, and this run takes "
        f"{plan.steps_per_iteration} after {plan.fill_env_steps}: another compiled program, "
        "so it cannot continue the run. `num_envs`, `n_step`, `batch_size`, "
        "`num_sgd_steps_per_step` and `samples_per_insert` (and this version's "
        "samples-per-insert rule, acme_jax_dqn/rate_limiting.py) set the iteration: resume "
        "with the checkpoint's values and the version that wrote it, or start a new run.")
  if saved is not None and saved != plan.as_dict():
    experiment = meta.get("experiment", {})
    flags_text = ", ".join(f"`{name}`={experiment.get(name)}" for name in
                           ("log_every", "eval_every", "checkpoint_every", "total_steps"))
    raise checkpointing.CheckpointError(
        f"`resume`: the checkpoint's run split its budget into {saved['num_chunks']} chunks "
        f"of {saved['iterations_per_chunk']} iterations, and these flags give "
        f"{plan.num_chunks} of {plan.iterations_per_chunk}. In anakin mode `log_every`, "
        "`eval_every`, `checkpoint_every` and `total_steps` set the chunks of the compiled "
        f"program: resume with the checkpoint's values ({flags_text}).")
  return int(meta.get("seed_devices", 1))


def read(experiment: ExperimentConfig, config: DQNConfig, target, earlier=None):
  """The newest readable checkpoint in `target`'s structure, as `RunCheckpoints.read` gives it
  (what the run's `RunCheckpoints.adopt` takes)."""
  run_checkpoints = checkpoints.RunCheckpoints(experiment, config)
  try:
    return run_checkpoints.read(target, earlier)
  finally:
    run_checkpoints.close()


def local_target(builder: DQNBuilder, networks, spec: specs.EnvironmentSpec,
                 include_replay: bool):
  """The shapes of `LocalAgent.checkpoint`'s arrays (the learner's state and, with
  `include_replay`, its replay's), on the default device, as its init would make them."""
  def arrays():
    state = learning.init_training_state(networks, builder.make_optimizer(),
                                         jax.random.PRNGKey(0), not builder.config.pqn)
    if not include_replay:
      return {"learner": state}
    return {"learner": state, "replay": builder.make_replay_buffer(spec).state}
  device = jax.config.jax_default_device or jax.devices()[0]  # Within `jax.default_device` too.
  if isinstance(device, str):  # A platform's name.
    device = jax.devices(device)[0]
  return _placed(jax.eval_shape(arrays), jax.sharding.SingleDeviceSharding(device))


def _placed(shapes, sharding):
  """`shapes` (a tree of shapes and dtypes, as `jax.eval_shape` gives) with every leaf placed
  by `sharding`: a restore target."""
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                        sharding=sharding), shapes)


def read_anakin(experiment: ExperimentConfig, config: DQNConfig, spec, state_shape, mesh):
  """The newest readable checkpoint of an anakin run, its state placed as the init places a
  fresh one (every leaf split over the seeds); also a checkpoint whose replay stores its items
  unpacked."""
  target = {"anakin": _placed(state_shape, jax.sharding.NamedSharding(mesh, P("seeds")))}
  codec = replay_lib.item_codec(DQNBuilder(config).example_transition(spec))
  return read(experiment, config, target, replay_lib.unpacked_layout(target, codec))


def read_distributed(experiment: ExperimentConfig, config: DQNConfig, networks,
                     spec: specs.EnvironmentSpec):
  """The newest readable checkpoint of a distributed run, read by the driver before Ray starts:
  the learner's state and, with `checkpoint_replay`, the replay node's buffer, on the host's CPU
  (the driver hands them to the nodes). Refuses a checkpoint that cannot continue the run."""
  builder = DQNBuilder(config)

  def arrays():
    state = {"learner": learning.init_training_state(networks, builder.make_optimizer(),
                                                     jax.random.PRNGKey(0))}
    if experiment.checkpoint_replay:
      state["replay"] = builder.make_replay().init(builder.example_transition(spec))
    return state
  restored = read(experiment, config, _placed(
      jax.eval_shape(arrays), jax.sharding.SingleDeviceSharding(xla_setup.host_device())))
  _, _, host, step = restored
  if not host or "replay" not in host:
    path = os.path.join(checkpoints.checkpoint_directory(experiment), str(step))
    raise checkpointing.CheckpointError(
        f"`resume`: {path} holds a distributed run's final parameters only (no replay counts), "
        "so the run cannot continue from it. Start a new run in a new `logdir`; "
        "launch.evaluate still reads that checkpoint.")
  return restored
