"""Distributed mode: actor env steps/s with 1, 2 and 4 actors, and learner steps/s.

  python bench/distributed.py

Each row is one `launch.run_dqn --flagfile=launch/configs/cartpole_distributed.cfg`
process on this machine (local Ray), read back from summary.json:
- actor-bound: `--samples_per_insert=1`, so the rate limiter rarely holds
  the actors; env steps/s is what N actors deliver to the replay.
- learner-bound: `--samples_per_insert=1024`, so the learner never waits
  for data; learner steps/s is what one learner process does here (the
  run stops at `--max_learner_steps`).
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_list("num_actors", ["1", "2", "4"], "Actor counts to time.")
flags.DEFINE_integer("total_steps", 20_000, "Env steps per actor-bound run.")
flags.DEFINE_integer("learner_steps", 8_000, "Learner steps per learner-bound run.")
flags.DEFINE_string("logdir", "runs/bench_distributed", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/distributed.md", "Markdown table to write.")
FLAGS = flags.FLAGS
PRESET = "launch/configs/cartpole_distributed.cfg"


def _run(tag: str, *args) -> dict:
  return harness.run_preset([f"--flagfile={PRESET}", f"--total_steps={FLAGS.total_steps}"],
                            os.path.join(FLAGS.logdir, tag),
                            ["--eval_every=0", "--eval_episodes=1", *args])


def main(argv):
  del argv
  header = ["run", "actors", "env steps/s (actors)", "learner steps/s", "replay inserts/s",
            "replay samples/s", "wall s", "startup s"]
  rows, base = [], None
  for n in map(int, FLAGS.num_actors):
    for tag, extra in (("actor-bound", ["--samples_per_insert=1"]),
                       ("learner-bound", ["--samples_per_insert=1024",
                                          f"--max_learner_steps={FLAGS.learner_steps}"])):
      s = _run(f"{tag}_{n}", f"--num_actors={n}", *extra)
      rows.append(f"| {tag} | {n} | {s['actor_sps']:.0f} | {s['learner_steps_per_s']:.0f} | "
                  f"{s['replay_inserts_per_s']:.0f} | {s['replay_samples_per_s']:.0f} | "
                  f"{s['wall_s']:.1f} | {s['compile_s']:.1f} |")
      if tag == "actor-bound" and base is None:
        base = s["actor_sps"]
      if tag == "actor-bound":
        print(f"{n} actor(s): {s['actor_sps']:.0f} env steps/s, "
              f"{s['actor_sps'] / base:.2f}x of 1 actor")
      else:
        print(f"{n} actor(s), learner-bound: {s['learner_steps_per_s']:.0f} learner steps/s")
  print(harness.write_table(
      FLAGS.out, harness.command_line(), header, rows, summary=s,
      caption=f"CartPole-v1, {FLAGS.total_steps} env steps per run, local Ray on {os.cpu_count()} "
              "cores; all nodes (replay, learner, actors, evaluator) on this machine."))


if __name__ == "__main__":
  app.run(main)
