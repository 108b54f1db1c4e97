"""The run's training chunks compiled with XLA compiler options of their own, against the defaults.

  python -m bench.compiler_options --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --variants='xla_cpu_multi_thread_eigen=false;xla_cpu_use_xnnpack=false' \\
      --seed_counts=1 --total_steps=100000 --repeats=6

For each seed count, the chunk programs of the command's run (the run's own
structure: warm-up loops and acting apart as `launch.run_dqn` picks them on
this backend, one device, seeds vmapped past one) are compiled once with
XLA's defaults and once per variant, each variant's options passed to that
program's compile alone (`jax.jit(...).lower(...).compile(compiler_options=...)`),
so nothing else in the process, and no peer program, sees them. A variant
is a space-separated list of XLA option=value pairs (a value may hold
commas); `--variants` separates variants with semicolons. One run is init
and every chunk of the plan with its metrics copied to the host (no
evaluation). The programs are called in turn, a warm-up round first; each
timed round (its order turned by one each round) gives every variant's env
steps/s over the default's, and the table prints the median (and range) of
those ratios, the seconds of each variant's chunk compiles (init compiles
once, with the defaults, and every run includes it), and whether the
variant trained the same parameters (an option may change rounding). A
value other than true/false goes to XLA as text, which it parses for the
option's type; a list option (`xla_gpu_enable_command_buffer=FUSION,WHILE`)
replaces XLA's default list.
"""

import os
import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from acme_jax_dqn import checkpointing
from acme_jax_dqn import xla_setup
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

launch_flags.define_flags()

flags.DEFINE_string("variants", "", "XLA option sets to compare with the defaults: "
                    "'name=value name=value;name=value' (semicolons between variants, spaces "
                    "between the options of one).")
flags.DEFINE_list("seed_counts", ["1"], "Seeds on the one device; each count compiles the "
                  "chunk programs of every variant.")
flags.DEFINE_integer("repeats", 6, "Timed rounds per seed count after the warm-up round.")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/compiler_options_<backend>.md).")
FLAGS = flags.FLAGS


def parse_variants(text: str) -> Dict[str, anakin_programs.Options]:
  """`anakin_programs.parse_options(text)`; exits with one line naming the flag when malformed."""
  try:
    variants = anakin_programs.parse_options(text)
  except ValueError as error:
    harness.bad_input(f"--variants: {error}; write e.g. "
                      "--variants='xla_cpu_multi_thread_eigen=false'.")
  if not variants:
    harness.bad_input("--variants is empty: give at least one option set, e.g. "
                      "--variants='xla_cpu_multi_thread_eigen=false'.")
  return variants


def check_options(variants: Dict[str, anakin_programs.Options]) -> None:
  """Compiles a one-op program with each variant, so an option XLA does not know, or a value it
  cannot read, is named (with exit code 2) before the run's programs compile."""
  tiny = jax.jit(lambda x: x + 1).lower(jnp.zeros(()))
  for label, options in variants.items():
    first = anakin_programs.refused(tiny, options)
    if first:
      harness.bad_input(f"--variants: XLA refused '{label}' ({first}); "
                        f"{anakin_programs.refusal_hint(first)}.")


def main(argv):
  del argv
  config, experiment = harness.anakin_run_flags(FLAGS.repeats)
  counts = harness.seed_counts(FLAGS.seed_counts)
  variants = parse_variants(FLAGS.variants)
  check_options(variants)
  table = harness.PrintedTable(
      ["seeds", "program", "compile s", "run s (median)", "env steps/s", "over the default "
       "(env steps/s, median and range)", "same params as the default"],
      summary=harness.jax_here())
  lines: List[str] = []
  for num_seeds in counts:
    compared = dict(anakin_programs.RUN_DEFAULT)
    compared.update({label: anakin_programs.Variant(options=options)
                     for label, options in variants.items()})
    with xla_setup.prng_impl(experiment.prng_impl):
      progs, plan, _ = anakin_programs.programs(experiment, config, num_seeds, compared)
      times, results = anakin_programs.timed_rounds(progs, FLAGS.repeats)
    steps = plan.env_steps * num_seeds
    default_sum = checkpointing.params_checksum(results[anakin_programs.DEFAULT][0])
    for name, prog in progs.items():
      ratios = [d / t for d, t in zip(times[anakin_programs.DEFAULT], times[name])]
      same = checkpointing.params_checksum(results[name][0]) == default_sum
      median = statistics.median(times[name])
      table.add(f"| {num_seeds} | {name} | {prog.compile_s:.1f} | {median:.2f} | "
                f"{steps / median:,.0f} | {statistics.median(ratios):.2f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'no'} |")
      if name != anakin_programs.DEFAULT:
        lines.append(f"{num_seeds} seed(s), {name}: {statistics.median(ratios):.2f}x")
  table.close(
      FLAGS.out or f"bench/results/compiler_options_{jax.default_backend()}.md",
      f"compared: the training chunks of the command's run flags, {plan.num_chunks} chunk(s) of "
      f"{plan.iterations_per_chunk:,} iterations ({plan.env_steps:,} env steps per seed), "
      "compiled with XLA's defaults and with each variant's compiler options (that program's "
      f"compile only), then called in turn, {FLAGS.repeats} timed rounds per seed count "
      "after a warm-up round; the medians of the rounds' ratios over the default: "
      + "; ".join(lines) + ".")


if __name__ == "__main__":
  app.run(main)
