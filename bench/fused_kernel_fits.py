"""Which networks the fused loss kernel fits on an H200, as XLA builds it, without a GPU.

  PYTHONPATH=$PWD:/tmp/jax_0112/site:/tmp/jax_0112/cuda /tmp/jax_0112/bin/python \\
      -m bench.fused_kernel_fits

On a GPU a run with `--fused_loss` first compiles the kernel alone and
refuses, in one line, a network whose kernel asks a program for more
shared memory than the GPU has (`fused_loss.check_fits`). This bench makes
the same compile for an H200 (bench/gpu_targets/h200.txtpb, through JAX's
CUDA plugin of this jax version: bench/gpu_target.py) for each network of
`--network`, batch size of `--batch_sizes` and `--double_q` value, and
prints what XLA's own build of the kernel asks for: the shared memory of
its program (from XLA's thunk sequence) or, where it does not fit, the
compiler's refusal. The width check of a run (`choices.FUSED_LOSS_MAX_WIDTH`)
is not applied, so wider networks show why it is there.
"""

import os
import sys
import tempfile

from absl import app
from absl import flags

from acme_jax_dqn import fused_loss

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import gpu_target  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_multi_string("network", ["4/120,84/2", "128/128,128/128",
                                      "128/128,128,128,128/128", "4/256/2", "4/256,256/2"],
                          "A network as inputs/hidden units (comma-separated)/actions; repeat "
                          "the flag for more.")
flags.DEFINE_list("batch_sizes", ["128"], "Batch sizes.")
flags.DEFINE_list("double_q", ["false", "true"], "Double Q-learning off, on or both.")
flags.DEFINE_string("out", "bench/results/fused_kernel_fits_h200.md", "Markdown table to write.")
FLAGS = flags.FLAGS
KERNEL = "fused_q_learning_loss"  # The pallas_call's name, as XLA's thunks name it.


def main(argv):
  del argv
  networks = gpu_target.parse_networks(FLAGS.network)
  if not networks:
    harness.bad_input(f"--network={' --network='.join(FLAGS.network)}: give "
                      "inputs/hidden/actions, e.g. --network=4/120,84/2.")
  try:
    batch_sizes = [int(b) for b in FLAGS.batch_sizes]
  except ValueError:
    batch_sizes = []
  if not batch_sizes or min(batch_sizes) < 1:
    harness.bad_input(f"--batch_sizes={','.join(FLAGS.batch_sizes)}: give positive integers.")
  choices = {"false": False, "true": True}
  if not FLAGS.double_q or any(v.lower() not in choices for v in FLAGS.double_q):
    harness.bad_input(f"--double_q={','.join(FLAGS.double_q)}: give false, true or both.")
  place = gpu_target.placement("h200")
  table = harness.PrintedTable(
      ["network (inputs / hidden / actions)", "batch", "double_q", "XLA's build for an H200"],
      summary=harness.jax_here())
  for inputs, hidden, actions in networks:
    for batch_size in batch_sizes:
      for double_q in (choices[v.lower()] for v in FLAGS.double_q):
        refused = []  # XLA's (requested, available) bytes, where it refuses the program.
        with tempfile.TemporaryDirectory() as folder:

          def compile_kernel(fn, *shapes, folder=folder):
            try:
              gpu_target.lowered(fn, *place(list(shapes))).compile(
                  compiler_options={"xla_dump_to": folder})
            except Exception as error:  # pylint: disable=broad-except
              refused.extend(fused_loss.SHARED_MEMORY.findall(str(error)))
              raise

          try:
            fused_loss.check_fits(inputs, hidden, actions, batch_size, double_q, 1.0,
                                  compile_kernel=compile_kernel)
            got = f"fits: asks {gpu_target.thunk_shared_bytes(folder, KERNEL) / 1024:.0f} KiB"
          except ValueError:  # `check_fits`'s refusal, from XLA's.
            requested, available = (int(n) / 1024 for n in refused[0])
            got = f"refused: asks {requested:.0f} KiB, the GPU has {available:.0f} KiB"
        network = f"{inputs} / {','.join(map(str, hidden))} / {actions}"
        table.add(f"| {network} | {batch_size} | {double_q} | {got} |")
  table.close(FLAGS.out, "compared: the shared memory a program of the fused loss kernel asks "
              "for, as XLA builds it for an H200 (bench/gpu_targets/h200.txtpb) where a GPU run "
              "checks it before compiling its programs (fused_loss.check_fits), per network, "
              "batch size and double_q; the H200 gives a program at most 227 KiB.")


if __name__ == "__main__":
  app.run(main)
