"""Where a local-mode env step spends its time: select, env step, observe, learner update.

  python bench/profile_local.py --num_envs=1
  python bench/profile_local.py --num_envs=8

Uses the CleanRL-matching settings of launch/configs/cartpole_local_cleanrl.cfg
(batch 128 every 10 env steps, 120-84 MLP) with learning from 1,000 inserts
(before the timed iterations) and epsilon 0.05, times each phase of the loop with perf_counter, and
prints microseconds per loop iteration (one iteration = num_envs env steps).
`--block` waits for each learner step to finish inside `update`, which shows
that XLA runs it asynchronously and the next action selection waits for it.
"""

import time

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import envs, specs, xla_setup
from agents.dqn import DQNConfig, LocalAgent

flags.DEFINE_integer("num_envs", 1, "Environment copies.")
flags.DEFINE_integer("iterations", 3000, "Timed loop iterations (after 1000 untimed).")
flags.DEFINE_bool("block", False, "Wait for each learner step inside update.")
flags.DEFINE_integer("variable_update_period", 1, "Actor calls between parameter pulls.")
flags.DEFINE_bool("one_cpu_core", False, "Run XLA's CPU client on one core (as --one_cpu_core).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  n = FLAGS.num_envs
  xla_setup.configure_cpu_dispatch(n)  # Before the client exists, as run_dqn does.
  if FLAGS.one_cpu_core:
    xla_setup.run_xla_on_one_cpu_core()
  config = DQNConfig(hidden_sizes=(120, 84), batch_size=128, samples_per_insert=12.8,
                     replay_capacity=10_000, min_replay_size=1_000, target_update_period=50,
                     learning_rate=2.5e-4, huber_delta=0.0, max_grad_norm=0.0,
                     epsilon_start=0.05, epsilon_end=0.05, num_envs=n,
                     variable_update_period=FLAGS.variable_update_period)
  batched = None if n == 1 else n
  env = envs.make_environment("gymnasium:CartPole-v1", seed=0, num_envs=batched)
  agent = LocalAgent(specs.make_environment_spec(env), config, jax.random.PRNGKey(0),
                     num_envs=batched)
  observation = np.zeros((4,), np.float32)
  agent.warmup(observation if batched is None else np.stack([observation] * n))
  clock = time.perf_counter
  totals = np.zeros(4)
  timestep = env.reset()
  agent.observe_first(timestep)
  for i in range(1000 + FLAGS.iterations):
    t0 = clock()
    action = agent.select_action(timestep.observation)
    t1 = clock()
    timestep = env.step(action)
    t2 = clock()
    agent.observe(action, timestep)
    t3 = clock()
    agent.update()
    if FLAGS.block:
      jax.block_until_ready(agent.learner.get_variables()[0])  # Cached for the actor anyway.
    t4 = clock()
    if batched is None and timestep.last():
      timestep = env.reset()
      agent.observe_first(timestep)
    if i >= 1000:
      totals += [t1 - t0, t2 - t1, t3 - t2, t4 - t3]
  per_iteration = totals / FLAGS.iterations * 1e6
  names = ("select_action", "env.step", "observe", "update")
  print(f"num_envs={n} block={FLAGS.block} variable_update_period="
        f"{FLAGS.variable_update_period}: microseconds per loop iteration "
        f"({n} env steps), learner calls {agent.learner_calls}")
  for name, value in zip(names, per_iteration):
    print(f"  {name:14s} {value:8.1f}")
  total = per_iteration.sum()
  print(f"  {'total':14s} {total:8.1f}  -> {n * 1e6 / total:.0f} env steps/s in this loop")


if __name__ == "__main__":
  app.run(main)
