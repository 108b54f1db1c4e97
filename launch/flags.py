"""absl flags: one per DQNConfig field (same name), plus the run flags; and flags -> config."""

import dataclasses
import typing

from absl import flags

from agents.dqn.config import ConfigError, DQNConfig, field_docs
from agents.dqn.experiment import ExperimentConfig, PRNG_IMPLS, RUN_MODES
from launch import cli

FLAGS = flags.FLAGS


def _define_field_flag(field: dataclasses.Field, help_text: str) -> None:
  name, default = field.name, field.default
  kind = typing.get_type_hints(DQNConfig)[name]
  if kind is bool:
    flags.DEFINE_bool(name, default, help_text)
  elif kind is int:
    flags.DEFINE_integer(name, default, help_text)
  elif kind is float:
    flags.DEFINE_float(name, default, help_text)
  elif kind is str:
    flags.DEFINE_string(name, default, help_text)
  else:  # Tuple[int, ...]: a comma-separated list.
    flags.DEFINE_list(name, [str(v) for v in default], help_text)


def define_flags() -> None:
  """Defines the run flags and one flag per `DQNConfig` field (idempotent)."""
  if "total_steps" in FLAGS:
    return
  docs = field_docs()
  experiment_defaults = ExperimentConfig()
  flags.DEFINE_string("env", experiment_defaults.env,
                      "Environment PREFIX:ID, e.g. gymnasium:CartPole-v1.")
  flags.DEFINE_enum("run_mode", "local", list(RUN_MODES),
                    "local: Python loop over any environment; anakin: the whole run "
                    "compiled on a JAX (gymnax) environment; distributed: replay, "
                    "learner and --num_actors actors on Ray.")
  flags.DEFINE_integer("seed", 0, "Seed for parameters, exploration, replay and envs.")
  flags.DEFINE_integer("total_steps", experiment_defaults.total_steps,
                       "Environment steps to train for (all env copies counted).")
  flags.DEFINE_string("logdir", experiment_defaults.logdir,
                      "Directory for train.csv, eval.csv and summary.json.")
  flags.DEFINE_integer("eval_episodes", experiment_defaults.eval_episodes,
                       "Greedy evaluation episodes at each evaluation.")
  flags.DEFINE_integer("eval_every", 0, "Env steps between evaluations (0: at the end only).")
  flags.DEFINE_integer("log_every", experiment_defaults.log_every,
                       "Env steps between progress lines and train.csv rows.")
  flags.DEFINE_bool("quiet", False, "No progress lines on the terminal.")
  flags.DEFINE_integer("num_seeds", 1, "Seeds trained together in one compiled program "
                       "(anakin mode): --seed, --seed + 1, ...")
  flags.DEFINE_string("compilation_cache_dir", "~/.cache/acme_jax_dqn/xla",
                      "JAX's persistent compilation cache: reruns of the same "
                      "program skip compiling. Empty turns it off.")
  flags.DEFINE_bool("one_cpu_core", False, "Run XLA's CPU client on one core: on 2 cores "
                    "the compiled anakin loop ran 1.1-1.5x faster, a cold compile 1.6x slower.")
  flags.DEFINE_integer("cpu_devices", 0, "Anakin mode on the CPU: XLA CPU devices the seeds "
                       "are split over, each block of seeds its own program on its own thread "
                       "(0: one per seed, up to 64, with an MLP torso; one with a conv torso, "
                       "whose ops use every core already, or with --one_cpu_core). Seeds split "
                       "evenly: over the most devices that divide --num_seeds. 16 seeds of the "
                       "PureJaxRL preset ran 1.8x as fast on 16 devices as on 1 (2 cores).")
  flags.DEFINE_enum("prng_impl", experiment_defaults.prng_impl, list(PRNG_IMPLS),
                    "JAX's PRNG for every key of the run: threefry2x32 (JAX's default), rbg "
                    "or unsafe_rbg (XLA's RngBitGenerator; unsafe_rbg also splits keys "
                    "without threefry). With unsafe_rbg the fast CartPole preset's cold "
                    "compile was shorter (2.4-4.6 s on 2 CPU cores). Other random streams, "
                    "so other runs; a checkpoint resumes only with its own.")
  flags.DEFINE_bool("save_checkpoints", True, "Save orbax checkpoints: at the end, every "
                    "--checkpoint_every env steps, and on SIGTERM / Ctrl-C.")
  flags.DEFINE_string("checkpoint_dir", "", "Checkpoint directory (default <logdir>/checkpoints).")
  flags.DEFINE_integer("checkpoint_every", 0, "Env steps between checkpoints (0: at the end "
                       "and on SIGTERM / Ctrl-C only).")
  flags.DEFINE_integer("keep_checkpoints", 3, "Newest checkpoints kept (0 keeps all).")
  flags.DEFINE_bool("checkpoint_replay", True, "Save the replay buffer in checkpoints (exact "
                    "resume); without it a resumed local run refills replay first.")
  flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --checkpoint_dir "
                    "toward the same --total_steps (the whole run's budget).")
  flags.DEFINE_bool("skip_nonfinite_updates", False, "On a non-finite loss or gradient, skip "
                    "the update and go on (counted) instead of stopping the run.")
  flags.DEFINE_integer("num_actors", experiment_defaults.num_actors,
                       "Distributed mode: actor nodes, each with its own epsilon.")
  flags.DEFINE_string("ray_address", "", "Distributed mode: HOST:PORT of a Ray cluster to "
                      "join (default: $RAY_ADDRESS, else start Ray on this machine).")
  flags.DEFINE_integer("max_learner_steps", 0, "Distributed mode: also stop at this many "
                       "learner steps (0: no limit).")
  flags.DEFINE_string("actor_resource", "", "Distributed mode: a Ray custom resource the "
                      "actor nodes require (places them on the nodes that offer it).")
  flags.DEFINE_integer("actor_insert_batch", experiment_defaults.actor_insert_batch,
                       "Distributed mode: transitions an actor sends to replay per call.")
  flags.DEFINE_list("loggers", list(experiment_defaults.loggers),
                    "Where train and eval rows go: terminal, csv (train.csv, eval.csv), "
                    "tensorboard (event files in --logdir), wandb (extra install).")
  flags.DEFINE_string("wandb_project", experiment_defaults.wandb_project,
                      "W&B project for --loggers=...,wandb.")
  flags.DEFINE_string("wandb_mode", experiment_defaults.wandb_mode,
                      "W&B mode: offline (no network; `wandb sync` later), online or disabled.")
  for field in dataclasses.fields(DQNConfig):
    _define_field_flag(field, docs.get(field.name, field.name))


def parse_flags(argv):
  """`app.run`'s flags parser: a bad flag or flagfile is one line on stderr and exit code 2."""
  return cli.parse_flags(argv)


_CONTRADICTIONS = (
    # (flag when true, flags that cannot apply with it when also given, why).
    ("apex_epsilons", ("epsilon_start", "epsilon_end", "epsilon_decay_steps"),
     "Ape-X epsilons are fixed per env copy and replace the linear epsilon schedule"),
)


def command_line_flag_names(argv) -> set:
  """Names of the flags written on the command line itself (not read from a --flagfile)."""
  names = set()
  for arg in argv[1:]:
    if arg == "--":
      break
    if arg.startswith("--"):
      name = arg[2:].split("=", 1)[0]
      names.update((name, name[2:]) if name.startswith("no") else (name,))
  return names


def check_contradictions(argv=None) -> None:
  """Flags given together that cannot both apply (ConfigError naming them).

  A flag written on the command line overrides contradicting flags that
  come only from a --flagfile (e.g. `--apex_epsilons` after a preset with
  an epsilon schedule), as any later flag overrides a flagfile's value.
  """
  import sys  # pylint: disable=import-outside-toplevel
  explicit = command_line_flag_names(sys.argv if argv is None else argv)
  for flag, others, why in _CONTRADICTIONS:
    given = [name for name in others if FLAGS[name].present
             and (name in explicit or flag not in explicit)]
    if FLAGS[flag].value and given:
      raise ConfigError(f"--{flag} with {', '.join('--' + g for g in given)}: {why}. "
                        f"Drop one of them.")


def _parse_int_list(name: str, values) -> tuple:
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise ConfigError(f"--{name}={','.join(values)}: must be a comma-separated list "
                     "of integers, e.g. 256,256.") from None


def config_from_flags(argv=None) -> DQNConfig:
  """The one place where flags become a DQNConfig (validated by the config).

  `argv` (default sys.argv) tells which flags were written on the command
  line, for `check_contradictions`.
  """
  check_contradictions(argv)
  values = {}
  for field in dataclasses.fields(DQNConfig):
    value = FLAGS[field.name].value
    if typing.get_type_hints(DQNConfig)[field.name] not in (bool, int, float, str):
      value = _parse_int_list(field.name, value)
    values[field.name] = value
  return DQNConfig(**values)


def experiment_from_flags() -> ExperimentConfig:
  try:
    return _experiment_from_flags()
  except ValueError as error:
    raise ConfigError(str(error)) from error


def _experiment_from_flags() -> ExperimentConfig:
  return ExperimentConfig(env=FLAGS.env, run_mode=FLAGS.run_mode, seed=FLAGS.seed,
                          total_steps=FLAGS.total_steps, logdir=FLAGS.logdir,
                          eval_episodes=FLAGS.eval_episodes, eval_every=FLAGS.eval_every,
                          log_every=FLAGS.log_every, quiet=FLAGS.quiet,
                          num_seeds=FLAGS.num_seeds,
                          compilation_cache_dir=FLAGS.compilation_cache_dir,
                          one_cpu_core=FLAGS.one_cpu_core,
                          cpu_devices=FLAGS.cpu_devices,
                          prng_impl=FLAGS.prng_impl,
                          save_checkpoints=FLAGS.save_checkpoints,
                          checkpoint_dir=FLAGS.checkpoint_dir,
                          checkpoint_every=FLAGS.checkpoint_every,
                          keep_checkpoints=FLAGS.keep_checkpoints,
                          checkpoint_replay=FLAGS.checkpoint_replay,
                          resume=FLAGS.resume,
                          skip_nonfinite_updates=FLAGS.skip_nonfinite_updates,
                          num_actors=FLAGS.num_actors, ray_address=FLAGS.ray_address,
                          max_learner_steps=FLAGS.max_learner_steps,
                          actor_resource=FLAGS.actor_resource,
                          actor_insert_batch=FLAGS.actor_insert_batch,
                          loggers=tuple(FLAGS.loggers), wandb_project=FLAGS.wandb_project,
                          wandb_mode=FLAGS.wandb_mode)
