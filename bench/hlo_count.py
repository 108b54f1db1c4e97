"""Counting the kernels one loop iteration runs in a program's optimized HLO text.

`iteration_body(text)` finds the entry computation's longest-running loop
(the scan over training iterations) and counts its body by kind (fusions,
unfused ops, custom calls, nested loops, conditionals), with a total per
iteration: a nested loop's body once per trip (XLA's `known_trip_count`),
a conditional's largest branch (`per_iteration`) or smallest
(`per_iteration_min`). Used by bench/hlo_kernels.py.

It also models the memory traffic of those kernels (`bytes_per_iteration`,
`bytes_per_iteration_min`): each kernel reads its operands and writes its
result, except that a gather, slice or dynamic slice of an operand reads
only what it takes (at most all of it), and a scatter or dynamic update
slice into an operand (which XLA runs in place) reads and writes only its
update. A kernel that waits on launch latency (one seed on a GPU) costs its
count; one that streams a batch of seeds' parameters and activations costs
its bytes. The model counts no cache and no re-read inside a kernel (a
matmul's tiles). `copy_bytes_per_iteration` is the part of
`bytes_per_iteration` that copies move: a copy streams at about the
memory's bandwidth, where the other kernels' arithmetic and access
patterns set their pace. A nested loop whose trip count XLA does not know
counts one trip, and `bytes_per_iteration_not_due` counts none (its test
alone): such a loop runs only when something is due, as the target update
in a loop (`acme_jax_dqn.target_updates.target_update_in_loop`) does, the
one such loop in the kit's chunk programs.
"""

import collections
import math
import re
from typing import Dict, List, Optional, Tuple

# What one run of a computation adds up (`kernels`), loops and calls summed into their callers.
TOTALS = ("per_iteration", "per_iteration_min", "bytes_per_iteration", "bytes_per_iteration_min",
          "copy_bytes_per_iteration", "bytes_per_iteration_not_due")
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "opt-barrier",
        "after-all", "partition-id", "replica-id"}
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"(body|condition|calls|to_apply|true_computation|false_computation)="
                     r"%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_ARRAY = re.compile(r"\b(pred|bf16|c64|c128|[suf](\d+)\w*)\[([\d,]*)\]")  # f8e4m3fn[..]: 8 bits.
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}
_PARTIAL_READS = ("gather", "slice", "dynamic-slice")
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}  # The operand that is the update.
_VIEWS = ("bitcast", "reshape")


def _opcode(rhs: str) -> str:
  """The opcode of an instruction's right-hand side: the word after its shape."""
  if rhs.startswith("("):  # A tuple shape: skip to its closing parenthesis.
    depth = 0
    for i, char in enumerate(rhs):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        rhs = rhs[i + 1:]
        break
  else:
    rhs = rhs.split(" ", 1)[1] if " " in rhs else rhs
  return rhs.strip().split("(", 1)[0]


def shape_bytes(shape: str) -> int:
  """The bytes of an HLO shape's arrays (a tuple's summed; sub-byte types packed)."""
  return sum(-(-(_BITS.get(dtype) or int(width)) * math.prod(int(d) for d in dims.split(",") if d)
               // 8) for dtype, width, dims in _ARRAY.findall(shape))


def parts(line: str) -> Tuple[str, str, str, List[str]]:
  """(name, result shape, opcode, operand names) of an instruction line."""
  name, rhs = line.split(" = ", 1)
  opcode = _opcode(rhs)
  start = rhs.index(opcode + "(")
  depth, end = 0, len(rhs)
  for i in range(start + len(opcode), len(rhs)):
    depth += {"(": 1, ")": -1}.get(rhs[i], 0)
    if depth == 0:
      end = i
      break
  operands = re.findall(r"%([\w.\-]+)", rhs[start:end])
  return name.replace("ROOT", "").strip().lstrip("%"), rhs[:start].strip(), opcode, operands


def _accessed(lines: List[str], operand_shapes: List[str]) -> int:
  """Bytes a kernel whose instructions are `lines` reads and writes (see the module doc).

  `operand_shapes` are the kernel's operands, `parameter(i)` in `lines`."""
  instructions = [parts(line) for line in lines]
  shapes = {name: shape for name, shape, _, _ in instructions}
  ops_of = {name: (opcode, operands) for name, _, opcode, operands in instructions}
  users = collections.defaultdict(list)
  params = {}
  for line, (name, _, opcode, operands) in zip(lines, instructions):
    for position, operand in enumerate(operands):
      users[operand].append((name, opcode, position))
    if opcode == "parameter":
      params[name] = int(re.search(r"parameter\((\d+)\)", line).group(1))

  def read(name: str) -> Optional[int]:
    """Bytes read of `name` when every use takes part of it (None: all of it)."""
    total = 0
    for user, opcode, position in users[name]:
      if opcode in _VIEWS:  # A view that is itself a result (no users) is all of it.
        part = read(user) if users[user] else None
      elif position == 0 and opcode in _PARTIAL_READS:
        part = shape_bytes(shapes[user])
      elif position == 0 and opcode in _IN_PLACE:
        part = 0
      else:
        return None
      if part is None:
        return None
      total += part
    return total

  def param_view(name: str) -> bool:
    """Whether `name` is a parameter, or a view of one (what XLA can update in place)."""
    opcode, operands = ops_of[name]
    return opcode == "parameter" or (opcode in _VIEWS and param_view(operands[0]))

  def written(name: str) -> int:
    opcode, operands = ops_of[name]
    if opcode == "tuple":
      return sum(written(operand) for operand in operands)
    if opcode in _VIEWS:
      return written(operands[0])
    if opcode in _IN_PLACE and param_view(operands[0]):
      return shape_bytes(shapes[operands[_IN_PLACE[opcode]]])
    return shape_bytes(shapes[name])

  root = next((name for line, (name, _, _, _) in zip(lines, instructions)
               if line.startswith("ROOT")), instructions[-1][0])
  total = written(root)
  for name, index in params.items():
    part, whole = read(name), shape_bytes(operand_shapes[index])
    total += whole if part is None else min(part, whole)  # Overlapping parts: at most all.
  return total


def parse_hlo(text: str) -> Tuple[str, Dict[str, List[str]]]:
  """(the entry computation's name, {computation: its instruction lines})."""
  computations: Dict[str, List[str]] = {}
  entry, current = "", None
  for line in text.splitlines():
    match = _COMPUTATION.match(line)
    if match and " = " not in line:
      current = match.group(2)
      computations[current] = []
      if match.group(1):
        entry = current
    elif current is not None and " = " in line:
      computations[current].append(line.strip())
    elif line.startswith("}"):
      current = None
  return entry, computations


def module_shapes(computations: Dict[str, List[str]]) -> Dict[str, str]:
  """{instruction name: its result shape} over a module (names are unique in one)."""
  return {name: shape for lines in computations.values()
          for name, shape, _, _ in map(parts, lines)}


def kernel_bytes(line: str, computations: Dict[str, List[str]], shapes: Dict[str, str]) -> int:
  """The bytes one kernel (a fusion, an unfused op, a custom call) reads and writes."""
  _, shape, opcode, operands = parts(line)
  operand_shapes = [shapes.get(operand, "") for operand in operands]
  called = dict(_CALLED.findall(line))
  if called.get("calls") in computations:  # A fusion: what its instructions take of each operand.
    return _accessed(computations[called["calls"]], operand_shapes)
  lines = [f"%p{i} = {s} parameter({i})" for i, s in enumerate(operand_shapes)]
  lines.append(f"ROOT %r = {shape} {opcode}({', '.join(f'%p{i}' for i in range(len(lines)))})")
  return _accessed(lines, operand_shapes)


def kernels(name: str, computations: Dict[str, List[str]],
            shapes: Optional[Dict[str, str]] = None,
            listing: Optional[List[Tuple[str, int, int]]] = None) -> Dict[str, int]:
  """Counts of `name`'s instructions by kind, and what one call of it runs.

  `per_iteration` counts a conditional's largest branch (an iteration that
  learns, say); `per_iteration_min` its smallest (one that does not);
  `bytes_per_iteration` and `bytes_per_iteration_min` the modelled traffic
  of the same kernels (the branch with the most bytes, the fewest);
  `copy_bytes_per_iteration` the part of `bytes_per_iteration` that copies move;
  `bytes_per_iteration_not_due` those of `bytes_per_iteration`'s kernels when every loop of
  unknown trip count runs no trip. With `listing`, appends (instruction line, modelled bytes
  of one run, runs per call) for each kernel that `bytes_per_iteration` counts.
  """
  shapes = module_shapes(computations) if shapes is None else shapes

  def called_kernels(computation, runs=1):  # `kernels` of a callee, its listing into ours.
    sub = None if listing is None else []
    counts_ = kernels(computation, computations, shapes, sub)
    return counts_, [(line, bytes_, n * runs) for line, bytes_, n in sub or []]

  counts = collections.Counter(dict.fromkeys(TOTALS, 0))
  for line in computations[name]:
    rhs = line.split(" = ", 1)[1]
    opcode = _opcode(rhs)
    called = dict(_CALLED.findall(line))
    if opcode in FREE:
      continue
    if opcode == "while":
      counts["while"] += 1
      trips = _TRIPS.search(line)
      trip_count = int(trips.group(1)) if trips else 1  # Unknown: one trip.
      body, body_list = called_kernels(called["body"], trip_count)
      condition, condition_list = called_kernels(called["condition"], trip_count)
      if listing is not None:
        listing.extend(body_list + condition_list)
      for total in TOTALS:
        if total == "bytes_per_iteration_not_due" and not trips:
          counts[total] += condition[total]  # No trip: its test alone.
          continue
        counts[total] += trip_count * (body[total] + condition[total]) + (
            0 if "bytes" in total else 1)
    elif opcode == "conditional":
      counts["conditional"] += 1
      branches = _BRANCHES.search(line)
      names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else
               [called[k] for k in ("true_computation", "false_computation") if k in called])
      runs, lists = zip(*[called_kernels(b) for b in names])
      counts["per_iteration"] += 1 + max(r["per_iteration"] for r in runs)
      counts["per_iteration_min"] += 1 + min(r["per_iteration_min"] for r in runs)
      most = max(runs, key=lambda r: r["bytes_per_iteration"])
      if listing is not None:
        listing.extend(lists[runs.index(most)])
      for total in ("bytes_per_iteration", "copy_bytes_per_iteration",
                    "bytes_per_iteration_not_due"):  # Those of the branch with the most bytes.
        counts[total] += most[total]
      counts["bytes_per_iteration_min"] += min(r["bytes_per_iteration_min"] for r in runs)
    elif opcode == "call":
      callee, callee_list = called_kernels(called["to_apply"])
      if listing is not None:
        listing.extend(callee_list)
      for total in TOTALS:
        counts[total] += callee[total]
    else:
      counts["fusion" if opcode == "fusion" else
             "custom-call" if opcode == "custom-call" else "unfused"] += 1
      counts["copy"] += opcode == "copy"  # Copies among the unfused ops (this level's).
      accessed = kernel_bytes(line, computations, shapes)
      if listing is not None:
        listing.append((line, accessed, 1))
      counts["copy_bytes_per_iteration"] += accessed if opcode == "copy" else 0
      for total in TOTALS:
        if total != "copy_bytes_per_iteration":  # Counted above, for copies alone.
          counts[total] += accessed if "bytes" in total else 1
  return dict(counts)


def top_kernels(listing: List[Tuple[str, int, int]], count: int, per_step: int = 1
                ) -> List[Dict[str, object]]:
  """The `count` kernels of `listing` (as `kernels` gives it) that move the most bytes per
  iteration (a loop step of `per_step` iterations), each with its name, what it is, its result
  shape, the bytes of one run, its runs per iteration and the JAX operation it came from."""
  total = sum(bytes_ * runs for _, bytes_, runs in listing) or 1
  rows = []
  for line, bytes_, runs in sorted(listing, key=lambda item: -item[1] * item[2])[:count]:
    name, shape, opcode, _ = parts(line)
    kind = re.search(r"kind=(\w+)", line) if opcode == "fusion" else None
    source = re.search(r'op_name="([^"]*)"', line)
    rows.append({"name": name.strip().split()[-1].lstrip("%"),
                 "op": f"{opcode} {kind.group(1)}" if kind else opcode, "shape": shape,
                 "mb_per_run": bytes_ / 1e6, "runs": runs / per_step,
                 "share": bytes_ * runs / total,
                 "source": source.group(1).split("/while/body/")[-1] if source else ""})
  return rows


def module_name(text: str) -> str:
  """The name of the module `text` holds (its first line: `HloModule <name>, ...`)."""
  found = re.match(r"\s*HloModule\s+([\w.\-]+)", text)
  return found.group(1) if found else ""


def op_bytes(text: str) -> Dict[str, int]:
  """{kernel's instruction name: the bytes one run of it reads and writes, as `kernel_bytes`
  models them} for every kernel of the module: the fusions, unfused ops and custom calls of its
  computations that are not a fusion's body, less loops, conditionals and calls (whose kernels
  are those of the computations they run). The names are those a profiler gives the kernels."""
  _, computations = parse_hlo(text)
  shapes = module_shapes(computations)
  fusion_bodies = {called for lines in computations.values() for line in lines
                   for kind, called in _CALLED.findall(line) if kind == "calls"}
  out = {}
  for computation, lines in computations.items():
    if computation in fusion_bodies:
      continue
    for line in lines:
      name, _, opcode, _ = parts(line)
      if opcode not in FREE and opcode not in ("while", "conditional", "call"):
        out[name] = kernel_bytes(line, computations, shapes)
  return out


def _entry_loops(text: str) -> Tuple[Dict[str, List[str]], List[str]]:
  """(the computations, the entry computation's loop instructions)."""
  entry, computations = parse_hlo(text)
  return computations, [line for line in computations[entry]
                        if _opcode(line.split(" = ", 1)[1]) == "while"]


def _trip_count(loop: str) -> int:
  """A loop instruction's known trip count (0 when XLA does not know it)."""
  return int((_TRIPS.search(loop) or [0, "0"])[1])


def entry_trip_counts(text: str) -> List[int]:
  """The trip counts of the entry computation's loops, in program order (0: not known)."""
  return [_trip_count(loop) for loop in _entry_loops(text)[1]]


def iteration_body(text: str, listing: Optional[List[Tuple[str, int, int]]] = None
                   ) -> Dict[str, int]:
  """The counts of the body of the entry's longest-running loop (the scan over iterations);
  with `listing`, its kernels as `kernels` lists them."""
  computations, loops = _entry_loops(text)
  if not loops:
    raise SystemExit("No loop in the program's entry computation: nothing to count.")
  best = max(loops, key=_trip_count)
  called = dict(_CALLED.findall(best))
  shapes = module_shapes(computations)
  counts = kernels(called["body"], computations, shapes, listing)
  condition = kernels(called["condition"], computations, shapes, listing)
  for total in TOTALS:
    counts[total] += condition[total]
  return counts
