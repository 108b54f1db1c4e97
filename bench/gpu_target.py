"""Programs compiled for a GPU this host does not have (bench/hlo_kernels.py --target=h200,
bench/fused_kernel_resources.py, bench/fused_kernel_fits.py).

XLA's GPU compiler reads the device from a description in
bench/gpu_targets/<target>.txtpb, through JAX's CUDA plugin of this jax
version, which must be importable (bench/hlo_kernels.py says how) and must
not start a GPU: call `placement` before JAX starts its backends.
"""

import contextlib
import glob
import math
import os
import re
from typing import Callable

import jax

from bench import harness

GPU_TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
# The device `placement` places on, as an abstract mesh (None: this host's devices).
TARGET_MESH = None
# An H200's (and H100's) SM: compute capability 9.0.
SM = {"capability": 90, "registers": 65536, "shared_bytes": 228 * 1024, "warps": 64,
      "programs": 32}
_NETWORK = re.compile(r"^(\d+)/(\d+(?:,\d+)*)/(\d+)$")
_LOCATION = re.compile(r' \[unknown\]| "[^"\n]*"\(#loc\d+\)| loc\(#loc\d+\)')


def placement(target: str) -> Callable:
  """A function that places a tree of shapes on one `target` device, made without the device."""
  global TARGET_MESH  # pylint: disable=global-statement
  os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
  jax.config.update("jax_platforms", "cpu")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  with open(os.path.join(GPU_TARGETS, f"{target}.txtpb")) as f:
    description = f.read()
  try:
    topology = topologies.get_topology_desc("gpu_target", "cuda", target_config=description,
                                            topology="1x1x1")
  except (NotImplementedError, RuntimeError) as error:
    plugin = f"jax-cuda13-plugin=={jax.__version__} jax-cuda13-pjrt=={jax.__version__}"
    harness.bad_input(f"--target={target}: no GPU compiler here ({error}). In a virtualenv "
                      f"made with --system-site-packages, `pip install --no-deps {plugin}` "
                      "and run the bench with its python.")
  mesh = topologies.make_mesh(topology, (1,), ("device",))
  TARGET_MESH = mesh.abstract_mesh
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def lowered(fn, *args):
  """`jax.jit(fn)` lowered for `args`' device. For a target device, under its abstract mesh:
  from jax 0.11 Pallas's Triton lowering reads the GPU it lowers for from there (or from the
  default device, here a CPU)."""
  target = (contextlib.nullcontext() if TARGET_MESH is None
            else jax.sharding.use_abstract_mesh(TARGET_MESH))
  with target:
    return jax.jit(fn).lower(*args)


def triton_module(printed: str) -> str:
  """The Triton module in what `pallas_call(debug=True)` printed, with its locations taken out
  (they print as annotations that MLIR's parser does not read)."""
  start = printed.index("module @")
  lines = [line for line in printed[start:].splitlines()
           if not line.startswith(("#loc", " at #loc"))]
  text = "\n".join(lines)
  return _LOCATION.sub("", text[:text.rindex("\n}") + 2]) + "\n"


def programs_per_sm(registers: int, shared: int, num_warps: int) -> int:
  """Programs an SM holds at once: registers go to a warp in units of 256."""
  per_warp = math.ceil(registers * 32 / 256) * 256
  return min(SM["registers"] // (per_warp * num_warps),
             SM["shared_bytes"] // max(shared, 1), SM["warps"] // num_warps, SM["programs"])


def parse_networks(values):
  """[(inputs, hidden sizes, actions)] from strings `inputs/hidden,.../actions`; None where one
  is not of that form."""
  networks = []
  for value in values:
    found = _NETWORK.match(value)
    if not found:
      return None
    networks.append((int(found.group(1)), tuple(int(h) for h in found.group(2).split(",")),
                     int(found.group(3))))
  return networks


def thunk_shared_bytes(folder: str, kernel: str) -> int:
  """The shared memory per program of `kernel` in the thunk sequences XLA dumped to `folder`
  (`compiler_options={"xla_dump_to": folder}`)."""
  found = re.compile(re.escape(kernel) + r" .*shared_memory: (\d+) bytes")
  for path in glob.glob(os.path.join(folder, "*thunk_sequence*")):
    with open(path) as f:
      for line in f:
        match = found.search(line)
        if match:
          return int(match.group(1))
  raise ValueError(f"no {kernel} kernel in the thunk sequences in {folder}")
