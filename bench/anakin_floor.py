"""The floor under an anakin run: its SGD steps alone, and its acting + env stepping alone.

  python -m bench.anakin_floor --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg

Builds the same trainer as `launch.run_dqn` from the flagfile, fills replay,
then times (after compiling) two scans: `--learner_steps` calls of the
kit's learner step (replay sample + SGD + target update), and every
iteration of the run's act + env step + replay insert with learning off.
Prints one JSON line (seconds); bench/speed.py --mode=anakin compares the
full run against their sum.

With `--reference`, it also times the same number of steps of a learner
written here by hand for plain DQN with the run's settings (an MLP in
Haiku, the kit's optax chain, uniform indices into arrays of the replay's
capacity, the squared or Huber TD error against a target copy replaced
every `target_update_period` steps): what that math costs written
plainly with these libraries, so `sgd_over_reference` says what the
kit's learner step adds to it. Plain DQN only: a run flag it does not
model stops it with exit code 2.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import envs
from acme_jax_dqn import learning
from acme_jax_dqn import xla_setup
from agents.dqn.anakin import AnakinPlan
from agents.dqn.builder import DQNBuilder
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_integer("learner_steps", 0, "Learner calls to time (0: as many as the run makes).")
flags.DEFINE_bool("reference", False, "Also time a hand-written plain-DQN learner step of the "
                  "run's settings (see the module docstring).")
FLAGS = flags.FLAGS
# Settings the hand-written learner leaves out, with the value it needs.
_PLAIN = {"n_step": 1, "double_q": False, "dueling": False, "distributional": False,
          "quantile": False, "munchausen": False, "layer_norm": False, "iqn": False,
          "noisy": False, "noisy_torso": False, "pqn": False, "prioritized": False,
          "fused_loss": False, "reward_clip": 0.0, "gradient_accumulation_steps": 1,
          "num_sgd_steps_per_step": 1}


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
  if FLAGS.reference:
    for field, plain in _PLAIN.items():
      if getattr(config, field) != plain:
        harness.bad_input(f"--reference: the hand-written learner is plain DQN; drop "
                          f"--{field} (it needs {plain!r}), or drop --reference.")
  jax.config.update("jax_default_prng_impl", experiment.prng_impl)  # The run's PRNG (--prng_impl).
  env = envs.make_jax_environment(experiment.env)
  if FLAGS.reference and len(env.spec.observations.shape) != 1:
    harness.bad_input(f"--reference: the hand-written learner is an MLP on flat observations; "
                      f"--env={experiment.env} gives {env.spec.observations.shape}: use "
                      "--env=gymnax:CartPole-v1, or drop --reference.")
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
  reference = {}
  if FLAGS.reference:
    program, args = _reference_program(config, env.spec, int(calls))
    reference_s = min(_timed(program, *args) for _ in range(2))
    reference = {"reference_s": reference_s, "us_per_reference_call": reference_s / calls * 1e6,
                 "sgd_over_reference": sgd_s / reference_s}
  print(json.dumps({"learner_calls": int(calls), "sgd_steps": int(calls * config.num_sgd_steps_per_step),
                    "sgd_s": sgd_s, "us_per_sgd_call": sgd_s / calls * 1e6,
                    "iterations": iterations, "env_steps": iterations * plan.steps_per_iteration,
                    "acting_s": acting_s,
                    "us_per_env_step": acting_s / (iterations * plan.steps_per_iteration) * 1e6,
                    **reference, "backend": jax.default_backend(), "numpy": np.__version__}))


def _reference_program(config, spec, calls: int):
  """(compiled program, its arguments): `calls` plain-DQN learner steps written from the paper."""
  import haiku as hk  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  num_actions = spec.actions.num_values
  q_network = hk.without_apply_rng(hk.transform(
      lambda x: hk.nets.MLP([*config.hidden_sizes, num_actions])(x)))
  optimiser = learning.make_optimizer(  # The kit's optax chain: the same update rule.
      learning.make_learning_rate(config.learning_rate, config.learning_rate_schedule,
                                  config.learning_rate_decay_steps, config.learning_rate_end),
      config.max_grad_norm, config.adam_eps)
  capacity, obs_shape = config.replay_capacity, spec.observations.shape
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  replay = {"obs": jax.random.normal(keys[0], (capacity, *obs_shape)),
            "next_obs": jax.random.normal(keys[1], (capacity, *obs_shape)),
            "action": jax.random.randint(keys[2], (capacity,), 0, num_actions),
            "reward": jax.random.normal(keys[3], (capacity,)),
            "discount": jnp.full((capacity,), config.discount)}
  params = q_network.init(keys[0], replay["obs"][:1])

  def td_loss(online, target, batch):
    q = q_network.apply(online, batch["obs"])
    q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
    bootstrap = jnp.max(q_network.apply(target, batch["next_obs"]), axis=1)
    error = q_taken - jax.lax.stop_gradient(batch["reward"] + batch["discount"] * bootstrap)
    if config.huber_delta > 0:
      return jnp.mean(optax.huber_loss(error, delta=config.huber_delta))
    return jnp.mean(0.5 * error ** 2)

  def step(carry, _):
    online, target, opt_state, key, count, replay = carry
    key, sample_key = jax.random.split(key)
    indices = jax.random.randint(sample_key, (config.batch_size,), 0, capacity)
    batch = jax.tree.map(lambda column: column[indices], replay)
    grads = jax.grad(td_loss)(online, target, batch)
    updates, opt_state = optimiser.update(grads, opt_state, online)
    online = optax.apply_updates(online, updates)
    count = count + 1
    target = optax.periodic_update(online, target, count, config.target_update_period) \
        if config.target_update_tau == 1.0 else optax.incremental_update(
            online, target, config.target_update_tau)
    return (online, target, opt_state, key, count, replay), None

  def run(online, key, replay):
    carry = (online, online, optimiser.init(online), key, jnp.int32(0), replay)
    return jax.lax.scan(step, carry, None, length=calls)[0][0]

  args = (params, jax.random.PRNGKey(2), replay)
  return jax.jit(run).lower(*args).compile(), args


if __name__ == "__main__":
  app.run(main)
