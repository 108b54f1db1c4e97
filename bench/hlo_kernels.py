"""Kernels one training iteration runs: the optimized HLO of the compiled trainer, ours and PureJaxRL's dqn.py.

  python -m bench.hlo_kernels --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --purejaxrl_dir=/path/to/purejaxrl [--target=h200] [--num_seeds=2048]

On a GPU a small iteration's time is set by how many kernels it launches
and by the host round trips of loop and cond predicates, not by its
arithmetic. This counts them, without a GPU, in the optimized HLO of the
program that runs the iterations (`--num_seeds` on one device, laid out
as launch.run_dqn lays out a device's block): the body of its scan over
iterations, by kind (fusions, unfused ops, custom calls, nested loops and
conditionals), and a total per iteration that counts a nested loop's body
once per trip (XLA's `known_trip_count`) and a conditional's largest
branch. A chunk that runs its learning warm-up as a loop of its own
(`seed_layout.warmup_loops`) is compiled twice, all learning and all
warm-up, and each count read off its loop. With `--scan_unroll`=u a loop
step runs u iterations: the chunk holds u times `--iterations`, and the
counts per iteration are a loop step's divided by u.

Prioritized replay is counted with `--target=local` only: flashbax builds
its sum tree for the devices it finds.

`--target=local` (the default) compiles for JAX's default backend: this
host's CPU, or the GPU of a GPU machine (there with XLA's autotuning).
`--target=h200` compiles both
programs for an H200 on this host, with no GPU: XLA's GPU compiler reads
the device description in bench/gpu_targets/h200.txtpb, and the kit
traces its programs as for a GPU (`xla_setup.building_for`). What that
needs is JAX's CUDA plugin of this jax version, in a virtualenv that sees
the project's packages (the plugin would try to start a GPU in every
process of the project's own environment):

  python -m venv --system-site-packages /tmp/gpu_aot
  /tmp/gpu_aot/bin/pip install --no-deps jax-cuda13-plugin==$JAX jax-cuda13-pjrt==$JAX
  /tmp/gpu_aot/bin/python -m bench.hlo_kernels --target=h200 ...

The H200 runs in docs/benchmarks.md used jax 0.11.2, whose XLA compiles
some programs differently (PureJaxRL's: fewer copies); bench/jax_0112_venv.sh
makes a Python 3.12 virtualenv with that version and its plugin.

Without a device XLA cannot autotune, so its GEMM tilings are its
defaults: kernel counts are the GPU's, their run times are not measured.
`--xla_options` compiles our programs with XLA options (one option set as
bench/compiler_options.py's `--variants` takes them), e.g.
`xla_gpu_experimental_force_split_k=1`; PureJaxRL's keeps XLA's defaults.

PureJaxRL's `purejaxrl/dqn.py` is read from --purejaxrl_dir (a checkout of
luchris429/purejaxrl; nothing of it enters this repository) and run with
its `main()` config. In memory only: gymnax 1.0's step returns
`terminated, truncated` where the script unpacks one `done` (so `done` is
their `or`), `wandb`, which it imports but does not use here, is a
stand-in module, and `jax.tree_map` (gone from jax 0.6 on) is `jax.tree.map`.
"""

import functools
import json
import math
import os
import sys
import time
from typing import Callable, Optional, Tuple

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from acme_jax_dqn import envs  # pylint: disable=wrong-import-position
from acme_jax_dqn import xla_setup  # pylint: disable=wrong-import-position
from agents.dqn import anakin as anakin_mode  # pylint: disable=wrong-import-position
from agents.dqn import seed_layout  # pylint: disable=wrong-import-position
from agents.dqn.builder import DQNBuilder  # pylint: disable=wrong-import-position
from agents.dqn.config import ConfigError, DQNConfig  # pylint: disable=wrong-import-position
from agents.dqn.experiment_config import ExperimentConfig  # pylint: disable=wrong-import-position
from bench import anakin_programs  # pylint: disable=wrong-import-position
from bench import gpu_target  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position
from bench import hlo_count  # pylint: disable=wrong-import-position
from bench import purejaxrl_peer  # pylint: disable=wrong-import-position
from launch import cli  # pylint: disable=wrong-import-position
from launch import flags as launch_flags  # pylint: disable=wrong-import-position

launch_flags.define_flags()
flags.DEFINE_string("purejaxrl_dir", "", "A checkout of luchris429/purejaxrl (its purejaxrl/dqn.py "
                    "is compiled beside ours); empty: ours only.")
flags.DEFINE_bool("purejaxrl_independent_seeds", False, "Give each of PureJaxRL's vmapped "
                  "seeds its own key from its network's init on (in memory); as the script "
                  "is, its seeds share one key after their first reset "
                  "(bench/purejaxrl_peer.py).")
flags.DEFINE_integer("iterations", 4, "Iterations in the compiled chunk (any; the body is the same).")
flags.DEFINE_enum("target", "local", ["local", "h200"], "The device to compile for: JAX's "
                  "default backend here, or an H200, compiled for on a host with no GPU "
                  "(needs JAX's CUDA plugin; see the module's docstring).")
flags.DEFINE_enum("acting_apart", "auto", ["auto", "yes", "no"], "Whether the loop that learns "
                  "keeps its acting forward apart from the learner's (auto: as a run does, "
                  "agents.dqn.seed_layout.acting_apart).")
flags.DEFINE_enum("packed_carry", "auto", ["auto", "yes", "no"], "Whether the chunk's loops "
                  "carry the environments, counters and keys in one word vector "
                  "(acme_jax_dqn/anakin_loops.py; auto: as a run does, "
                  "agents.dqn.seed_layout.packed_carry).")
flags.DEFINE_enum("target_loop", "auto", ["auto", "yes", "no"], "Whether learner steps move "
                  "the target in a loop that runs only when an update is due "
                  "(acme_jax_dqn.target_updates.target_update_in_loop; auto: as a run does, "
                  "agents.dqn.seed_layout.target_update_loop).")
flags.DEFINE_bool("packed_items", True, "Whether the replay stores its items packed "
                  "(acme_jax_dqn.replay.PackedItems), as a run does, or a leaf per field.")
flags.DEFINE_bool("scatters_as_selects", None, "Whether a gymnax environment's single-index "
                  "scatters run as selects (acme_jax_dqn/envs/scatter_selects.py) or as "
                  "scatters (--noscatters_as_selects); unset: as a run builds them for the "
                  "target, selects for a GPU and scatters for the CPU.")
flags.DEFINE_string("xla_options", "", "XLA options for our programs' compile, one option set "
                    "as bench/compiler_options.py's --variants takes: 'name=value name=value' "
                    "(e.g. xla_gpu_experimental_force_split_k=1); PureJaxRL's keeps XLA's "
                    "defaults.")
flags.DEFINE_integer("top_kernels", 0, "Also list, for each program, this many kernels of an "
                     "iteration that learns that move the most modelled bytes (what each is, "
                     "its shape, MB per run, runs per iteration, its share of the iteration's "
                     "MB and the JAX operation it came from).", lower_bound=0)
flags.DEFINE_string("out", None, "Markdown table to write ('' : none; default "
                    "bench/results/hlo_kernels.md on the CPU, else hlo_kernels_<target or "
                    "backend>.md, with _<n>_seeds before .md for --num_seeds=n above 1).")
FLAGS = flags.FLAGS


def _compiled_text(fn, *args, options: Optional[anakin_programs.Options] = None) -> str:
  """The optimized HLO of `fn` compiled for `args`' device (see `gpu_target.lowered`), with
  XLA's `options` (None: its defaults)."""
  return gpu_target.lowered(fn, *args).compile(compiler_options=options or None).as_text()


def xla_options(place: Callable) -> Optional[anakin_programs.Options]:
  """`--xla_options` as compiler options, each known to XLA and of a value it reads, checked on
  a one-op program for the target; a malformed set exits with one line naming the flag."""
  try:
    sets = anakin_programs.parse_options(FLAGS.xla_options)
  except ValueError as error:
    harness.bad_input(f"--xla_options: {error}; write e.g. "
                      "--xla_options='xla_gpu_experimental_force_split_k=1'.")
  if len(sets) > 1:
    harness.bad_input("--xla_options takes one option set (no ';'); compare several with "
                      "bench/compiler_options.py --variants.")
  options = next(iter(sets.values()), None)
  first = options and anakin_programs.refused(
      gpu_target.lowered(lambda x: x + 1, place(jax.ShapeDtypeStruct((), np.float32))), options)
  if first:
    harness.bad_input(f"--xla_options: XLA refused '{FLAGS.xla_options}' ({first}); "
                      f"{anakin_programs.refusal_hint(first)}.")
  return options


def ours_hlo(place: Callable, platform: str, config: DQNConfig, experiment: ExperimentConfig,
             options: Optional[anakin_programs.Options] = None
             ) -> Tuple[str, Optional[str], float, float, int]:
  """(optimized HLO of a chunk that learns, of one in its warm-up (None: one program with a
  conditional holds both), env steps per iteration, share of iterations that learn,
  iterations per loop step)."""
  env = envs.make_jax_environment(experiment.env)._replace(
      scatters_as_selects=FLAGS.scatters_as_selects)
  num_seeds = experiment.num_seeds
  # The program a run with every seed on one device compiles: unbatched for one seed (vmapped
  # under an RngBitGenerator PRNG), with the learning warm-up as a conditional or a loop of
  # its own (agents/dqn/anakin.py).
  batched = seed_layout.runs_batched(num_seeds, experiment.prng_impl)
  with xla_setup.building_for(platform), xla_setup.prng_impl(experiment.prng_impl):
    builder = DQNBuilder(config)
    trainer = builder.make_anakin(env, builder.make_networks(env.spec),
                                  packed_items=FLAGS.packed_items)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    state = place(jax.eval_shape(seed_layout.over_seeds(trainer.init, batched), keys))
    first = place(jax.ShapeDtypeStruct((), np.int32))

    unroll = experiment.scan_unroll
    iterations = FLAGS.iterations * unroll  # Whole loop steps.

    choice = lambda value: {"auto": None, "yes": True, "no": False}[value]

    def chunk_text(warmup):
      return _compiled_text(
          anakin_mode.chunk_fn(trainer, iterations, warmup, batched, unroll,
                               choice(FLAGS.acting_apart), choice(FLAGS.packed_carry),
                               choice(FLAGS.target_loop)),
          state, first, options=options)
    if not seed_layout.warmup_loops(batched):
      learning, warming_up = chunk_text(None), None
    else:
      learning, warming_up = chunk_text(0), chunk_text(iterations)
  return learning, warming_up, trainer.env_steps_per_iteration * config.num_envs, 1.0, unroll


def purejaxrl_hlo(checkout: str, place: Callable) -> Tuple[str, None, float, float, int]:
  """(optimized HLO, None, env steps per iteration, share of iterations that learn, 1)."""
  config = purejaxrl_peer.main_config(10 * FLAGS.iterations * 10)
  module = purejaxrl_peer.load(checkout, independent_seeds=FLAGS.purejaxrl_independent_seeds)
  train = purejaxrl_peer.make_train(module, config)
  keys = place(jax.eval_shape(lambda: jax.random.split(jax.random.PRNGKey(0),
                                                        FLAGS.num_seeds)))
  # It learns when its env-step count (NUM_ENVS more each iteration) is a multiple of
  # TRAINING_INTERVAL: that share of iterations, after LEARNING_STARTS.
  interval = config["TRAINING_INTERVAL"]
  return (_compiled_text(train, keys), None, config["NUM_ENVS"],
          math.gcd(config["NUM_ENVS"], interval) / interval, 1)


def _brief(shape: str) -> str:
  """An HLO result shape, a tuple's as its first array and how many more."""
  if not shape.startswith("("):
    return shape
  arrays = shape[1:-1].split(", ")
  return arrays[0] + (f" and {len(arrays) - 1} more" if len(arrays) > 1 else "")


def main(argv):
  del argv
  target = FLAGS.target
  if target != "local" and FLAGS.prioritized:
    # flashbax picks its sum-tree code from the devices it finds, and this host has no GPU.
    harness.bad_input(f"--target={target} with --prioritized: flashbax builds prioritized "
                      "replay for the devices it finds, which here are CPUs. Count it with "
                      "--target=local on a GPU machine, or drop --prioritized.")
  if target == "local":
    place, platform = (lambda tree: tree), jax.default_backend()
  else:
    place, platform = gpu_target.placement(target), "gpu"
  flagfiles = [os.path.basename(a.split("=", 1)[1]) for a in sys.argv
               if a.startswith("--flagfile=")]
  try:
    config, experiment = launch_flags.config_from_flags(), launch_flags.experiment_from_flags()
  except ConfigError as error:
    harness.bad_input(f"error: {cli.error_line(error)}")
  if FLAGS.acting_apart != "auto":
    with xla_setup.building_for(platform):
      loops = seed_layout.warmup_loops(
          seed_layout.runs_batched(experiment.num_seeds, experiment.prng_impl))
    if not loops:
      harness.bad_input(f"--acting_apart={FLAGS.acting_apart}: one seed on the CPU decides "
                        "each iteration's learning with a conditional, whose chunk has no loop "
                        "that both acts and learns; pass --num_seeds=2 or more, or "
                        "--target=h200.")
  unroll = experiment.scan_unroll
  flagfiles += [f"--scan_unroll={unroll}"] if unroll > 1 else []
  for structure in ("acting_apart", "packed_carry", "target_loop"):
    value = FLAGS[structure].value
    flagfiles += [f"--{structure}={value}"] if value != "auto" else []
  flagfiles += [] if FLAGS.packed_items else ["--nopacked_items"]
  if FLAGS.scatters_as_selects is not None:
    flagfiles += [f"--{'' if FLAGS.scatters_as_selects else 'no'}scatters_as_selects"]
  options = xla_options(place)
  flagfiles += [f"--xla_options={FLAGS.xla_options}"] if options else []
  builds = {f"ours ({', '.join(flagfiles) or 'default flags'})":
            functools.partial(ours_hlo, place, platform, config, experiment, options)}
  if FLAGS.purejaxrl_dir:
    seeds = ", seeds independent" if FLAGS.purejaxrl_independent_seeds else ""
    builds[f"PureJaxRL dqn.py (main() config{seeds})"] = functools.partial(
        purejaxrl_hlo, FLAGS.purejaxrl_dir, place)
  programs, build_s = {}, {}
  for name, build in builds.items():
    start = time.perf_counter()
    programs[name] = build()
    build_s[name] = time.perf_counter() - start
  header = ["program", "env steps per iteration", "kernels per iteration that learns",
            "kernels per iteration that does not", "kernels per 1,000 env steps (learning "
            "at the program's rate)", "fusions", "unfused ops", "of which copies", "custom calls",
            "loops",
            "conditionals", "MB per iteration that learns (modelled)",
            "of which copies (MB)", "MB per iteration that learns, no update due",
            "MB per iteration that does not", "build s"]
  rows = []
  results = {}
  top_notes = []
  for name, (text, warmup_text, steps, learning, per_step) in programs.items():
    listing = [] if FLAGS.top_kernels else None
    counts = hlo_count.iteration_body(text, listing)
    if FLAGS.top_kernels:
      top_notes.append(f"{name}, the {FLAGS.top_kernels} kernels of an iteration that learns "
                       "that move the most modelled bytes: " + "; ".join(
                           f"`{k['name']}` ({k['op']}, {_brief(k['shape'])}, from "
                           f"`{k['source'][-70:]}`): {k['mb_per_run']:,.1f} MB x "
                           f"{k['runs']:g} = {k['share']:.1%}"
                           for k in hlo_count.top_kernels(listing, FLAGS.top_kernels,
                                                          per_step)) + ".")
    if warmup_text is not None:  # The warm-up's own loop: what an iteration that does not learn runs.
      warmup = hlo_count.iteration_body(warmup_text)
      counts["per_iteration_min"] = warmup["per_iteration"]
      counts["bytes_per_iteration_min"] = warmup["bytes_per_iteration"]
    for total in ("per_iteration", "per_iteration_min"):  # A loop step runs `per_step` of them.
      per_iteration = round(counts[total] / per_step, 1)
      counts[total] = int(per_iteration) if per_iteration == int(per_iteration) else per_iteration
    counts["per_1000_steps"] = round(1000 * (learning * counts["per_iteration"] + (
        1 - learning) * counts["per_iteration_min"]) / steps)
    for total in [t for t in hlo_count.TOTALS if "bytes" in t]:
      counts[total.replace("bytes", "mb")] = round(counts.pop(total) / per_step / 1e6, 1)
    counts["build_s"] = round(build_s[name], 2)
    results[name] = counts
    harness.add_row(rows, "| " + " | ".join(str(x) for x in [
        name, steps, counts["per_iteration"], counts["per_iteration_min"],
        counts["per_1000_steps"], counts.get("fusion", 0),
        counts.get("unfused", 0), counts.get("copy", 0),
        counts.get("custom-call", 0), counts.get("while", 0), counts.get("conditional", 0),
        f"{counts['mb_per_iteration']:,.1f}", f"{counts['copy_mb_per_iteration']:,.1f}",
        f"{counts['mb_per_iteration_not_due']:,.1f}", f"{counts['mb_per_iteration_min']:,.1f}",
        f"{build_s[name]:.1f}"]) + " |")
  seeds = f"{FLAGS.num_seeds} seed{'s' if FLAGS.num_seeds > 1 else ''} on one device"
  if target != "local":
    backend = (f"the optimized GPU HLO for an {target.upper()}, compiled on this host without "
               f"one (bench/gpu_targets/{target}.txtpb)")
  elif platform == "cpu":
    backend = ("the optimized CPU HLO. The CPU backend keeps threefry's rounds as loops, which "
               "a GPU fuses, so PRNG work weighs more here")
  else:
    backend = f"the optimized HLO of this host's {jax.devices()[0].device_kind}"
  notes = ["compared: the top level of each program's scan body over iterations (fusions, "
           "unfused ops, custom calls, nested loops, conditionals), and the kernels one "
           "iteration runs (a nested loop's body times its trip count; a conditional's "
           "largest branch for an iteration that learns, its smallest for one that does "
           f"not; a warm-up loop of its own for one that does not), {seeds}, in {backend}. "
           "build s: seconds to trace, lower and compile the counted programs one after "
           "another in this process (ours: two where the warm-up is a loop of its own, which "
           "a run compiles side by side; PureJaxRL's: loading the script too). MB per "
           "iteration: the modelled memory traffic of those kernels (bench/hlo_count.py: "
           "each reads its operands and writes its result, gathers and slices only what "
           "they take, in-place updates only the update; no cache), a bound on an "
           "iteration's time when many seeds stream their parameters and activations; a "
           "nested loop whose trip count XLA does not know counts one trip, and none where "
           "no update is due (ours: the target update in a loop, which runs when one is)."]
  if unroll > 1:
    notes.append(f"With --scan_unroll={unroll} the fusions, unfused ops, custom calls, loops "
                 f"and conditionals are those of a loop step ({unroll} iterations); the "
                 f"kernels per iteration are a loop step's divided by {unroll}.")
  if len(results) == 2:
    (ours, theirs) = results.values()
    not_copied = lambda counts: counts["mb_per_iteration"] - counts["copy_mb_per_iteration"]
    notes.append("ratio (ours / PureJaxRL, kernels per iteration): "
                 f"{ours['per_iteration'] / max(theirs['per_iteration'], 1):.2f}x learning, "
                 f"{ours['per_iteration_min'] / max(theirs['per_iteration_min'], 1):.2f}x "
                 "not learning; per 1,000 env steps "
                 f"{ours['per_1000_steps'] / max(theirs['per_1000_steps'], 1):.2f}x; modelled "
                 "MB per iteration that learns "
                 f"{ours['mb_per_iteration'] / max(theirs['mb_per_iteration'], 0.1):.2f}x, "
                 f"less what copies move {not_copied(ours) / max(not_copied(theirs), 0.1):.2f}x"
                 " (a copy streams at about the memory's bandwidth; the other kernels' "
                 "arithmetic and access patterns set theirs).")
  notes += top_notes
  for note in notes:
    print(note)
  out = FLAGS.out
  if out is None:
    name = target if target != "local" else platform
    seeds = f"_{FLAGS.num_seeds}_seeds" if FLAGS.num_seeds > 1 else ""  # Not the 1-seed table.
    out = "bench/results/hlo_kernels" + ("" if name == "cpu" else f"_{name}") + seeds + ".md"
  if out:
    harness.write_table(out, harness.command_line(), header, rows, notes=notes,
                        summary=harness.jax_here())
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
