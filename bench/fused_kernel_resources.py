"""What the fused loss kernel takes of an H200's SM: registers, spills and shared memory, no GPU.

  PYTHONPATH=$PWD:/tmp/jax_0112/site:/tmp/jax_0112/cuda /tmp/jax_0112/bin/python \\
      -m bench.fused_kernel_resources --flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg \\
      --num_warps=4,8,16 --row_blocks=128,64,32

For each `--num_warps` and `--row_blocks` value (`fused_loss.NUM_WARPS`,
`fused_loss.ROW_BLOCK`), Pallas lowers the kernel of the run's network and
batch to a Triton module for the target, as a GPU run lowers it; Triton
(the `triton` package) compiles that module to PTX for the target's
compute capability with those warps, and Triton's own ptxas reports the
registers a thread takes, the bytes it spills and its stack frame; Triton
gives the shared memory a program takes. From those and the SM's limits
(65,536 registers, 228 KiB of shared memory, 64 warps, 32 programs) comes
how many programs an SM runs at once. A thread holds at most 255
registers: more live values spill to local memory, which an SM reads
through its L1 cache.

It needs what bench/hlo_kernels.py --target=h200 needs (JAX's CUDA plugin
of this jax version, bench/gpu_target.py) and the `triton` package:
bench/jax_0112_venv.sh makes a virtualenv with both (jax 0.11.2, Triton
3.6.0). XLA builds the kernel with a Triton of its own, whose shared
memory can differ: for the PureJaxRL preset 72 KiB against this build's
136 KiB (bench/results/fused_kernel_xla_thunk_h200.txt;
bench/fused_kernel_fits.py reads XLA's for any network).
"""

import contextlib
import dataclasses
import io
import math
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from acme_jax_dqn import envs
from acme_jax_dqn import fused_loss
from acme_jax_dqn import specs
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError
from launch import cli
from launch import flags as launch_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import gpu_target  # pylint: disable=wrong-import-position
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_list("num_warps", ["4", "8", "16"], "Triton warps per seed's program.")
flags.DEFINE_list("row_blocks", [str(fused_loss.ROW_BLOCK)],
                  "The kernel's batch rows per block (powers of two of 16 or more).")
flags.DEFINE_string("out", "", "Markdown table to write (default: "
                    "bench/results/fused_kernel_resources_h200.md).")
FLAGS = flags.FLAGS

_PTXAS = {"stack": re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                              r"(\d+) bytes spill loads"),
          "registers": re.compile(r"Used (\d+) registers")}


def lowered_module(place, widths, batch_size: int, double_q: bool, huber_delta: float) -> str:
  """The kernel's Triton module for these sizes and the current NUM_WARPS and ROW_BLOCK."""
  printed = io.StringIO()
  pallas_call = fused_loss.pl.pallas_call

  def compile_kernel(fn, *shapes):
    gpu_target.lowered(fn, *place(list(shapes)))

  try:
    fused_loss.pl.pallas_call = lambda *a, **k: pallas_call(*a, **{**k, "debug": True})
    with contextlib.redirect_stdout(printed):
      fused_loss.check_fits(widths[0], widths[1:-1], widths[-1], batch_size, double_q,
                            huber_delta, compile_kernel=compile_kernel)
  finally:
    fused_loss.pl.pallas_call = pallas_call
  return gpu_target.triton_module(printed.getvalue())


def resources(module: str, num_warps: int) -> dict:
  """Triton's build of `module` for the SM: registers, spills, stack and shared memory."""
  import triton  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
  from triton.backends.nvidia import compiler  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "kernel.ttir")
    with open(path, "w") as f:
      f.write(module)
    capability = gpu_target.SM["capability"]
    kernel = triton.compile(path, target=GPUTarget("cuda", capability, 32),
                            options={"num_warps": num_warps, "num_stages": 1})
    ptx = os.path.join(folder, "kernel.ptx")
    with open(ptx, "w") as f:
      f.write(kernel.asm["ptx"])
    report = subprocess.run(
        [compiler.get_ptxas(capability).path, f"-arch=sm_{capability}a", "-v", ptx, "-o",
         os.path.join(folder, "kernel.cubin")],
        capture_output=True, text=True, check=True).stderr
  stack, stores, loads = (int(n) for n in _PTXAS["stack"].search(report).groups())
  return {"registers": int(_PTXAS["registers"].search(report).group(1)), "spill_stores": stores,
          "spill_loads": loads, "stack": stack, "shared": kernel.metadata.shared}


def main(argv):
  del argv
  try:
    warps = [int(w) for w in FLAGS.num_warps]
    blocks = [int(b) for b in FLAGS.row_blocks]
  except ValueError:
    warps = blocks = []
  if not warps or min(warps) < 1 or any(w & (w - 1) for w in warps):
    harness.bad_input(f"--num_warps={','.join(FLAGS.num_warps)}: give powers of two.")
  if not blocks or any(b < 16 or b & (b - 1) for b in blocks):
    harness.bad_input(f"--row_blocks={','.join(FLAGS.row_blocks)}: give powers of two of 16 "
                      "or more (a Triton dot's least side).")
  try:
    import triton  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    harness.bad_input("no `triton` package here: bench/jax_0112_venv.sh makes a virtualenv "
                      "with it and JAX's CUDA plugin; run the bench with its python.")
  place = gpu_target.placement("h200")
  try:
    config = launch_flags.config_from_flags()
    experiment = launch_flags.experiment_from_flags()
    spec = envs.make_jax_environment(experiment.env).spec
    widths = [math.prod(spec.observations.shape), *config.hidden_sizes,
              specs.check_discrete_actions(spec, experiment.env)]
    # A network or loss the kernel does not compute: the run's own one-line refusal.
    DQNBuilder(dataclasses.replace(config, fused_loss=True)).make_networks(spec, experiment.env)
  except (ConfigError, ValueError) as error:
    harness.bad_input(f"error: {cli.error_line(error)}")
  table = harness.PrintedTable(
      ["warps", "batch rows per block", "registers per thread", "spill stores, loads (bytes "
       "per thread)", "stack frame (bytes)", "shared memory (KiB)", "programs per SM"],
      summary=harness.jax_here())
  saved = fused_loss.ROW_BLOCK
  try:
    for row_block in blocks:
      fused_loss.ROW_BLOCK = row_block
      module = lowered_module(place, widths, config.batch_size, config.double_q,
                              config.huber_delta)
      for num_warps in warps:  # The Triton module does not depend on the warps.
        got = resources(module, num_warps)
        table.add(f"| {num_warps} | {min(row_block, fused_loss.padded(config.batch_size))} | "
                  f"{got['registers']} | {got['spill_stores']:,}, {got['spill_loads']:,} | "
                  f"{got['stack']:,} | {got['shared'] / 1024:.0f} | "
                  f"{gpu_target.programs_per_sm(got['registers'], got['shared'], num_warps)} |")
  finally:
    fused_loss.ROW_BLOCK = saved
  table.close(
      FLAGS.out or "bench/results/fused_kernel_resources_h200.md",
      f"compared: the fused loss kernel of the run's network (layers {','.join(map(str, widths))}"
      f", batch {config.batch_size}, double_q {config.double_q}) lowered by Pallas for an H200 "
      f"(bench/gpu_targets/h200.txtpb) and compiled by Triton "
      f"{sys.modules['triton'].__version__} for sm_{gpu_target.SM['capability']} with one "
      "pipeline stage, as the kit compiles it; registers, spills and stack from Triton's ptxas "
      "-v, shared memory "
      "from Triton; programs per SM: the fewest that its registers (in units of 256 a warp), "
      "shared memory, warps and programs allow.")


if __name__ == "__main__":
  launch_flags.define_flags()
  app.run(main, flags_parser=launch_flags.parse_flags)
