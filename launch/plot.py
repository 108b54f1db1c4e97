"""Learning curves of finished runs: `python -m launch.plot --logdir=runs/ --out=curves.png`.

Finds every run under `--logdir` (a folder with summary.json and
eval.csv), reads its greedy eval returns against env steps (one curve per
seed; an anakin run of K seeds gives K curves), and draws one panel per
environment and one line per agent: the mean over seeds, shaded from the
lowest to the highest seed. The agent is named from the run's config
(DQN, Double, Dueling, C51, n-step, PER; all five is Rainbow), or with
`--label=dir` from the run's folder name without a `_seed<N>` or
`/seed<N>` ending.
"""

import json
import os
import sys

from absl import app
from absl import flags

from launch.cli import parse_flags
from launch.curves import draw, find_runs

FLAGS = flags.FLAGS
flags.DEFINE_string("logdir", "runs", "Folder searched (recursively) for runs.")
flags.DEFINE_string("out", "curves.png", "The PNG to write.")
flags.DEFINE_enum("label", "agent", ["agent", "dir"], "Name lines by the agent's config "
                  "or by the run's folder.")
flags.DEFINE_list("envs", [], "Only these environments (default: every one found).")
flags.DEFINE_string("title", "", "A title over the panels.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a --flag.")
  if not os.path.isdir(FLAGS.logdir):
    print(f"error: --logdir={FLAGS.logdir} is not a folder.", file=sys.stderr)
    return 2
  runs = find_runs(FLAGS.logdir, FLAGS.label, FLAGS.envs)
  if FLAGS.envs and not runs:
    print(f"error: no run under {FLAGS.logdir} is on --envs={','.join(FLAGS.envs)}.",
          file=sys.stderr)
    return 2
  try:
    drawn = draw(runs, FLAGS.out, FLAGS.title)
  except ValueError as error:
    print(f"error: {error} (searched {FLAGS.logdir})", file=sys.stderr)
    return 2
  print(json.dumps({"out": FLAGS.out, "panels": drawn}))
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
