"""How long one local learner call takes right after other work, against back-to-back calls.

  python bench/cold_calls.py
  python bench/cold_calls.py --one_cpu_core

In the local loop the learner runs once every 10 env steps, after about
1.2 ms of acting and env stepping (one env, about 3,800 env steps/s).
This times the same jitted learner call
(launch/configs/cartpole_local_cleanrl.cfg's settings: sample, one SGD
step of batch 128 on a 120-84 MLP, target update) back to back and after a
gap of busy Python work or of sleep, and prints wall and process CPU time
per call (and writes the table to --out as markdown when given). CPU time
that grows with the gap means the call itself computes slower (caches,
clocks), not that it waits for a thread.
"""

import os
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from acme_jax_dqn import envs, specs, xla_setup
from agents.dqn import DQNConfig, LocalAgent

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_bool("one_cpu_core", False, "Run XLA's CPU client on one core (as --one_cpu_core).")
flags.DEFINE_list("gaps_us", ["0", "300", "1000", "3000"], "Gaps before each call, microseconds.")
flags.DEFINE_integer("calls", 300, "Timed calls per gap.")
flags.DEFINE_string("out", "", "Markdown table to write as well (default: print only).")
FLAGS = flags.FLAGS


def _busy(seconds: float) -> None:
  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    pass


def main(argv):
  del argv
  xla_setup.use_synchronous_cpu_dispatch()  # As local mode with one env.
  if FLAGS.one_cpu_core:
    xla_setup.run_xla_on_one_cpu_core()
  config = DQNConfig(hidden_sizes=(120, 84), batch_size=128, samples_per_insert=12.8,
                     replay_capacity=10_000, min_replay_size=1_000, target_update_period=50,
                     learning_rate=2.5e-4, huber_delta=0.0, max_grad_norm=0.0, num_envs=1)
  env = envs.make_environment("gymnasium:CartPole-v1", seed=0)
  agent = LocalAgent(specs.make_environment_spec(env), config, jax.random.PRNGKey(0))
  agent.warmup(np.zeros((4,), np.float32))
  rng = np.random.default_rng(0)
  timestep = env.reset()
  agent.observe_first(timestep)
  for _ in range(2_000):  # Fill replay with random-policy transitions.
    action = int(rng.integers(2))
    timestep = env.step(action)
    agent.observe(action, timestep)
    if timestep.last():
      timestep = env.reset()
      agent.observe_first(timestep)
  agent.replay_buffer.write_pending()
  learner = agent.learner
  for _ in range(50):
    learner.step()
  jax.block_until_ready(learner.get_variables()[0])
  table = harness.PrintedTable(
      ["gap before each call", "gap us", "wall us per call", "CPU us per call"],
      f"One learner call (sample + SGD + target), {FLAGS.calls} calls per row, "
      f"{'--one_cpu_core' if FLAGS.one_cpu_core else 'XLA on all cores'}.", harness.jax_here())
  for kind, wait in (("busy Python", _busy), ("sleep", time.sleep)):
    for gap_us in map(int, FLAGS.gaps_us):
      if kind == "sleep" and gap_us == 0:
        continue
      wall = cpu = 0.0
      for _ in range(FLAGS.calls):
        if gap_us:
          wait(gap_us * 1e-6)
        w0, c0 = time.perf_counter(), time.process_time()
        learner.step()
        jax.block_until_ready(learner.get_variables()[0])
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
      table.add(f"| {kind if gap_us else 'none (back to back)'} | {gap_us} | "
                f"{wall / FLAGS.calls * 1e6:.0f} | {cpu / FLAGS.calls * 1e6:.0f} |")
  table.close(FLAGS.out, "compared: the same jitted learner call back to back and after a gap of "
              "other work or sleep; CartPole-v1 replay, this machine.")


if __name__ == "__main__":
  app.run(main)
