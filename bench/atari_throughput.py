"""Atari throughput on this machine: Pong through ale-py + gymnasium wrappers and through envpool.

  python bench/atari_throughput.py

Two parts, both printed and written to --out as markdown:
1. Environment alone: random actions, env steps/s (an env step is 4
   frames) for `atari:Pong` (1 copy, and 8 copies stepped in Python) and
   `envpool:Pong-v5` (8 copies stepped in C++ threads).
2. The agent: `launch.run_dqn --flagfile=launch/configs/atari_dqn.cfg` in
   local mode on each, timed from train.csv over the acting-only phase
   (before `min_replay_size`) and the learning phase (batch 32 every 4
   steps through the Nature conv torso), and what 10M env steps would take
   at the learning-phase rate.
"""

import os
import sys
import time

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_integer("env_steps", 4000, "Env steps per environment-alone timing.")
flags.DEFINE_integer("acting_steps", 2000, "Agent runs: env steps before learning starts.")
flags.DEFINE_integer("learning_steps", 2000, "Agent runs: env steps timed while learning.")
flags.DEFINE_string("logdir", "runs/bench_atari", "Where the agent runs write their logs.")
flags.DEFINE_string("out", "bench/results/atari_throughput.md", "Markdown table to write.")
FLAGS = flags.FLAGS

FULL_RUN = 10_000_000


def env_alone(name: str, num_envs: int) -> float:
  from acme_jax_dqn import envs  # pylint: disable=import-outside-toplevel
  environment = envs.make_environment(name, seed=0, num_envs=num_envs)
  rng = np.random.default_rng(0)
  actions = environment.action_spec().num_values
  environment.reset()
  taken, start = 0, time.perf_counter()
  while taken < FLAGS.env_steps:
    timestep = environment.step(rng.integers(0, actions, size=num_envs))
    taken += int(np.count_nonzero(timestep.step_type != 0))
  sps = taken / (time.perf_counter() - start)
  environment.close()
  return sps


def agent_run(name: str, num_envs: int) -> dict:
  logdir = os.path.join(FLAGS.logdir, f"{name.replace(':', '_')}_envs{num_envs}")
  total = FLAGS.acting_steps + FLAGS.learning_steps
  summary = harness.run_preset(
      ["--flagfile=launch/configs/atari_dqn.cfg", f"--env={name}", f"--num_envs={num_envs}",
       f"--total_steps={total}", f"--min_replay_size={FLAGS.acting_steps}",
       f"--replay_capacity={4 * total}", f"--log_every={FLAGS.acting_steps}", "--eval_every=0",
       "--eval_episodes=1"], logdir, ["--loggers=csv"])
  rows = harness.read_csv(logdir, "train.csv")
  first, last = rows[0], rows[-1]
  learn_steps = int(last["env_steps"]) - int(first["env_steps"])
  learn_s = float(last["wall_s"]) - float(first["wall_s"])
  return {"acting_sps": float(first["sps"]), "learning_sps": learn_steps / learn_s,
          "learner_steps_per_s": (int(last["learner_steps"]) - int(first["learner_steps"]))
                                 / learn_s,
          "compile_s": summary["compile_s"], "summary": summary}


def _hours(sps: float) -> str:
  return f"{FULL_RUN / sps / 3600:.0f} h"


def main(argv):
  del argv
  rows, base = [], None
  for name, copies in (("atari:Pong", 1), ("atari:Pong", 8), ("envpool:Pong-v5", 8)):
    sps = env_alone(name, copies)
    base = base or sps
    harness.add_row(rows, f"| {name} | {copies} | {sps:.0f} | {sps / base:.2f} |")
  agent_rows = harness.table_lines([
      "environment", "copies", "acting-only env steps/s", "learning env steps/s", "SGD steps/s",
      f"{FULL_RUN // 1_000_000}M env steps at the learning rate"])
  for name, copies in (("atari:Pong", 1), ("envpool:Pong-v5", 8)):
    r = agent_run(name, copies)
    harness.add_row(agent_rows, (
        f"| {name} | {copies} | {r['acting_sps']:.0f} | {r['learning_sps']:.0f} | "
        f"{r['learner_steps_per_s']:.1f} | {_hours(r['learning_sps'])} |"))
  harness.write_table(
      FLAGS.out, harness.command_line(),
      ["environment", "copies", "env steps/s", "x atari:Pong (1 copy)"], rows,
      caption="Environment alone (random actions; 1 env step = 4 frames):", summary=r["summary"],
      notes=["The agent (atari_dqn.cfg, local mode, batch 32 every 4 env steps):", "",
             *agent_rows])
  print(f"compared: env steps/s of Pong through ale-py + gymnasium wrappers (1 and 8 copies) "
        f"and envpool (8 copies), alone and under the DQN agent; table: {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
