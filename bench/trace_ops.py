"""A profiler trace's kernels, grouped by HLO op, with the bytes bench/hlo_count.py models.

`kernel_events` reads the kernels of a `jax.profiler.ProfileData` (a GPU's
stream events, or the thunks XLA's CPU runtime ran); `op_times` groups
them by HLO op per training iteration; `modelled_bytes` finds each op in
the optimized HLO of the program it belongs to. Used by bench/kernel_times.py.
"""

import collections
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from bench import hlo_count


# Lines of a GPU plane that the profiler derives from the streams' kernels (they overlap them).
DERIVED_LINES = ("XLA Modules", "XLA Ops", "Async XLA Ops", "XLA TraceMe", "Steps",
                 "Framework Name Scope", "Framework Ops", "TensorFlow Name Scope",
                 "TensorFlow Ops", "Source code", "Launch Stats", "Host Offload Ops",
                 "_counters_")
OP_LINE = "XLA Ops"  # A GPU plane's line with one event per run of an HLO op.
CONTROL_FLOW = ("while", "cond", "conditional", "call")  # CPU thunks that hold other thunks.


class Kernel(NamedTuple):
  """One kernel the device ran: its program's module, its HLO op, its own name, its seconds."""
  module: str
  op: str
  name: str
  seconds: float


def kernel_events(profile) -> Tuple[List[Kernel], Dict[Tuple[str, str], int], List[str]]:
  """([every kernel the device ran], {(module, op): runs} from a GPU plane's line of HLO ops
  (empty on the CPU, where each thunk is one run), [the trace lines read]): a GPU's stream
  events, or on the CPU the thunks that name an HLO op, less those of loops, conditionals and
  calls, whose time is their inner thunks' (other host events are Python's and the
  runtime's)."""
  out, runs, read = [], collections.Counter(), set()
  for plane in profile.planes:
    on_gpu = plane.name.startswith("/device:GPU")
    if not on_gpu and plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      if on_gpu and line.name == OP_LINE:
        for event in line.events:
          stats = dict(event.stats)
          runs[(str(stats.get("hlo_module", "")), str(stats.get("hlo_op", event.name)))] += 1
      if on_gpu and line.name in DERIVED_LINES:
        continue
      for event in line.events:
        stats = dict(event.stats)
        op = str(stats.get("hlo_op", event.name))
        if on_gpu or ("hlo_op" in stats and op.split(".")[0] not in CONTROL_FLOW):
          out.append(Kernel(str(stats.get("hlo_module", "")), op, event.name,
                            event.duration_ns * 1e-9))
          read.add(f"{plane.name} {line.name}")
  return out, dict(runs), sorted(read)


def modelled_bytes(texts: Sequence[str]) -> Callable[[str, str], Optional[int]]:
  """`bytes_of(module, op)`: what bench/hlo_count.py models one run of the op to read and write,
  from the optimized HLO `texts` of the traced programs; an op the trace names without its
  module is looked up in every module, and None where it is in none or in two with different
  bytes."""
  by_module: Dict[str, Dict[str, int]] = collections.defaultdict(dict)
  for text in texts:
    by_module[hlo_count.module_name(text)].update(hlo_count.op_bytes(text))

  def bytes_of(module: str, op: str) -> Optional[int]:
    if op in by_module.get(module, {}):
      return by_module[module][op]
    found = {ops[op] for ops in by_module.values() if op in ops}
    return found.pop() if len(found) == 1 else None

  return bytes_of


class OpTime(NamedTuple):
  """An HLO op's kernels in a trace, per training iteration."""
  module: str
  op: str
  runs: float  # Runs of the op per iteration (one run may launch several kernels).
  kernels: float  # Its kernels per iteration.
  us: float  # Its kernels' microseconds per iteration.
  bytes: Optional[int]  # Modelled bytes of one run.


def op_times(events: Sequence[Kernel], iterations: int, bytes_of,
             op_runs: Optional[Dict[Tuple[str, str], int]] = None) -> List[OpTime]:
  """The trace's kernels grouped by HLO op, the op with the most time first. An op's runs are
  those `op_runs` counts (a GPU trace's line of ops, keyed by module and op, or by op alone
  where that line names no module); else, as many as the kernel it launches most often."""
  op_runs = op_runs or {}
  grouped = collections.defaultdict(list)
  for kernel in events:
    grouped[(kernel.module, kernel.op)].append(kernel)
  out = []
  for (module, op), kernels in grouped.items():
    runs = op_runs.get((module, op)) or op_runs.get(("", op)) or max(
        collections.Counter(k.name for k in kernels).values())
    out.append(OpTime(module, op, runs / iterations, len(kernels) / iterations,
                      1e6 * sum(k.seconds for k in kernels) / iterations, bytes_of(module, op)))
  return sorted(out, key=lambda t: -t.us)
