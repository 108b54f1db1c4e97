"""MinAtar learning benchmark: a preset (minatar_dqn by default) in anakin mode on four games, K seeds each.

  python bench/minatar.py --total_steps=500000 --num_seeds=3 --one_cpu_core
  python bench/minatar.py --preset=minatar_pqn --total_steps=1000000

Each game is one `python -m launch.run_dqn` process with its seeds vmapped
(--num_seeds). Prints, and writes to --out as markdown, the greedy eval
return per seed and the mean against gymnax's published PPO returns, the
anchor this kit's presets are measured against.

A long run can be split over several sittings. Save a checkpoint every
evaluation, and keep two (a checkpoint holds the seeds' replay):

  python bench/minatar.py --preset=minatar_iqn_eps --games=Freeway \
      --total_steps=1000000 --logdir=runs/iqn_eps --out=runs/iqn_eps_fw.md \
      --run_flags=--save_checkpoints,--checkpoint_every=100000,--keep_checkpoints=2

Stop it (SIGKILL right after a checkpoint loses nothing; SIGTERM waits for
the next chunk's end), then give the same command with `,--resume` added to
--run_flags: each game goes on from its latest checkpoint, and its log rows
after that checkpoint are dropped. The wall-time column then counts from the
resumed start, so add the earlier sittings' wall time to it.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

# gymnax's README: PPO's returns on MinAtar, the anchor these runs are compared with.
PPO_RETURNS = {"Asterix": 15.0, "Breakout": 28.0, "Freeway": 58.0, "SpaceInvaders": 131.0}

flags.DEFINE_string("preset", "minatar_dqn", "Flagfile in launch/configs/, without .cfg.")
flags.DEFINE_list("games", list(PPO_RETURNS), "MinAtar games (gymnax:<game>-MinAtar).")
flags.DEFINE_integer("total_steps", 500_000, "Env steps per seed.")
flags.DEFINE_integer("num_seeds", 3, "Seeds vmapped in each game's run (from seed 0).")
flags.DEFINE_integer("eval_every", 100_000, "Env steps between evaluations (the curves).")
flags.DEFINE_bool("one_cpu_core", False, "Pass --one_cpu_core to the runs (leaves a core free).")
flags.DEFINE_list("run_flags", [], "More launch.run_dqn flags for every run, after the preset's "
                  "(e.g. --run_flags=--eval_epsilon=0.001).")
flags.DEFINE_string("logdir", "runs/bench_minatar", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/minatar.md", "Markdown table to write.")
FLAGS = flags.FLAGS


def run_game(game: str) -> dict:
  args = [f"--flagfile=launch/configs/{FLAGS.preset}.cfg", f"--env=gymnax:{game}-MinAtar",
          f"--num_seeds={FLAGS.num_seeds}", "--seed=0", f"--total_steps={FLAGS.total_steps}",
          f"--eval_every={FLAGS.eval_every}"]
  extra = (["--one_cpu_core"] if FLAGS.one_cpu_core else []) + FLAGS.run_flags
  return harness.run_preset(args, os.path.join(FLAGS.logdir, game), extra)


def main(argv):
  del argv
  header = ["game", "env steps per seed", "eval return per seed", f"mean of {FLAGS.num_seeds}",
            "PPO (gymnax)", "reached", "wall s (all seeds, compile incl.)", "sps all seeds"]
  rows, reached = [], 0
  for game in FLAGS.games:
    s = run_game(game)
    anchor = PPO_RETURNS.get(game)
    ok = anchor is not None and s["eval_return_mean"] >= anchor
    reached += ok
    per_seed = ", ".join(f"{v:.1f}" for v in s["eval_return_per_seed"])
    harness.add_row(rows, (
        f"| {game} | {s['env_steps']} | {per_seed} | **{s['eval_return_mean']:.1f}** "
        f"| {anchor if anchor is not None else '-'} | {'yes' if ok else 'no'} "
        f"| {s['wall_s']:.0f} | {s['sps_all_seeds']:.0f} |"))
    # After every game: a long run stopped part way keeps its finished rows.
    harness.write_table(FLAGS.out, harness.command_line(), header, rows, summary=s)
  print(f"compared: mean greedy eval return of {FLAGS.num_seeds} seeds after "
        f"{FLAGS.total_steps} env steps against gymnax's PPO returns; {reached}/"
        f"{len(FLAGS.games)} games reach them. Table: {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
