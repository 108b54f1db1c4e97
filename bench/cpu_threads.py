"""Cold runs with each `--cpu_threads` value, in turn: XLA's CPU worker threads.

  python -m bench.cpu_threads --preset=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --threads=2,1 --repeats=8
  python -m bench.cpu_threads --run_flags='--hidden_sizes=256,256 --total_steps=30000' \\
      --repeats=3 --out=bench/results/cpu_threads_mlp_256.md

Each round runs `launch.run_dqn` once per value, one process each with its
compile cache off, in the order given, and reads its summary.json:
compile s and env steps/s after compile. With more than one worker XLA's
CPU executor may run a loop split between two threads, which shows as a
slow run; the table gives every run, and per value the median, the lowest
and the highest rate, and each value's median over the first value's.
Whether the runs trained the same parameters is checked (their checksums):
for small matrices XLA's result does not depend on its threads, for
large ones the split of a matrix product over threads may round
differently.
"""

import os
import shlex
import statistics
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_string("preset", "launch/configs/cartpole_anakin_purejaxrl.cfg",
                    "The runs' flagfile.")
flags.DEFINE_list("threads", ["2", "1"], "--cpu_threads values, run in this order each round.")
flags.DEFINE_integer("repeats", 8, "Rounds.")
flags.DEFINE_string("run_flags", "", "More launch.run_dqn flags for every run, as one "
                    "shell-quoted string, e.g. '--hidden_sizes=256,256 --total_steps=30000'.")
flags.DEFINE_string("logdir", "runs/bench_cpu_threads", "Where the runs write their logs.")
flags.DEFINE_string("out", "bench/results/cpu_threads.md", "Markdown table to write.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  threads = [int(t) for t in FLAGS.threads]
  if FLAGS.repeats < 1 or not threads or min(threads) < 0:
    harness.bad_input(f"--repeats={FLAGS.repeats} --threads={','.join(FLAGS.threads)}: at "
                      "least 1 round and one value, each 0 (the kit's pick) or more.")
  rates = {t: [] for t in threads}
  checksums, last = set(), None
  table = harness.PrintedTable(["round", "--cpu_threads", "summary.json's cpu_threads",
                                "compile s", "env steps/s after compile"])
  for repeat in range(FLAGS.repeats):
    for t in threads:
      last = harness.run_preset(
          [f"--flagfile={FLAGS.preset}", f"--cpu_threads={t}", "--compilation_cache_dir="],
          os.path.join(FLAGS.logdir, f"threads{t}"), shlex.split(FLAGS.run_flags))
      rates[t].append(last.get("sps_after_compile_all_seeds", last["sps_after_compile"]))
      checksums.add(last["params_checksum"])
      table.add(f"| {repeat + 1} | {t} | {last.get('cpu_threads') or 'XLA default'} | "
                f"{last['compile_s']:.1f} | {rates[t][-1]:,.0f} |")
  table.summary = last
  base = statistics.median(rates[threads[0]])
  per_value = "; ".join(
      f"--cpu_threads={t}: median {statistics.median(r):,.0f} (lowest {min(r):,.0f}, highest "
      f"{max(r):,.0f}), {statistics.median(r) / base:.2f}x --cpu_threads={threads[0]}'s"
      for t, r in rates.items())
  table.close(
      FLAGS.out,
      f"compared: cold launch.run_dqn runs of --flagfile={FLAGS.preset} {FLAGS.run_flags} "
      "with each "
      f"--cpu_threads value in turn, {FLAGS.repeats} round(s), env steps/s after compile "
      f"(all seeds): {per_value}. Parameters: "
      + ("the same in every run." if len(checksums) == 1 else
         f"{len(checksums)} different checksums: the runs did not train the same parameters."))


if __name__ == "__main__":
  app.run(main)
