"""The floor under an anakin run: its SGD steps alone, and its acting + env stepping alone.

  python -m bench.anakin_floor --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg

Builds the same trainer as `launch.run_dqn` from the flagfile, fills replay,
then times (after compiling) two scans: `--learner_steps` calls of the
kit's learner step (replay sample + SGD + target update), and every
iteration of the run's act + env step + replay insert with learning off.
Prints one JSON line (seconds); bench/speed.py --mode=anakin compares the
full run against their sum.
"""

import json
import time

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import envs
from acme_jax_dqn import xla_setup
from agents.dqn.anakin import AnakinPlan
from agents.dqn.builder import DQNBuilder
from launch import flags as launch_flags

launch_flags.define_flags()
flags.DEFINE_integer("learner_steps", 0, "Learner calls to time (0: as many as the run makes).")
FLAGS = flags.FLAGS


def _timed(compiled, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return time.perf_counter() - start


def main(argv):
  del argv
  if FLAGS.one_cpu_core:  # Same XLA threading as the run it is compared with.
    xla_setup.run_xla_on_one_cpu_core()
  config = launch_flags.config_from_flags()
  experiment = launch_flags.experiment_from_flags()
  jax.config.update("jax_default_prng_impl", experiment.prng_impl)  # The run's PRNG (--prng_impl).
  env = envs.make_jax_environment(experiment.env)
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec))
  plan = AnakinPlan(trainer, config, experiment)
  iterations = plan.num_chunks * plan.iterations_per_chunk
  calls = FLAGS.learner_steps or (
      (plan.env_steps - plan.fill_env_steps - config.min_replay_size)
      // plan.steps_per_iteration * trainer.learner_calls_per_iteration)

  state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
  fill = -(-config.min_replay_size // plan.steps_per_iteration)
  state, _ = jax.jit(trainer.train_chunk, static_argnums=2)(state, -10**9, fill)

  def learner_scan(learner_state, buffer):
    step = lambda carry, _: (trainer.learner_step(*carry)[:2], None)
    return jax.lax.scan(step, (learner_state, buffer), None, length=calls)[0]  # All of it.

  def acting_scan(s):  # Learning never starts: the iteration index stays negative.
    return trainer.train_chunk(s, -10**9, iterations, unroll=plan.unroll)  # --scan_unroll

  sgd = jax.jit(learner_scan).lower(state.learner, state.buffer).compile()
  acting = jax.jit(acting_scan).lower(state).compile()
  sgd_s = min(_timed(sgd, state.learner, state.buffer) for _ in range(2))
  acting_s = min(_timed(acting, state) for _ in range(2))
  print(json.dumps({"learner_calls": int(calls), "sgd_steps": int(calls * config.num_sgd_steps_per_step),
                    "sgd_s": sgd_s, "us_per_sgd_call": sgd_s / calls * 1e6,
                    "iterations": iterations, "env_steps": iterations * plan.steps_per_iteration,
                    "acting_s": acting_s,
                    "us_per_env_step": acting_s / (iterations * plan.steps_per_iteration) * 1e6,
                    "backend": jax.default_backend(), "numpy": np.__version__}))


if __name__ == "__main__":
  app.run(main)
