"""Counting the kernels one loop iteration runs in a program's optimized HLO text.

`iteration_body(text)` finds the entry computation's longest-running loop
(the scan over training iterations) and counts its body by kind (fusions,
unfused ops, custom calls, nested loops, conditionals), with a total per
iteration: a nested loop's body once per trip (XLA's `known_trip_count`),
a conditional's largest branch (`per_iteration`) or smallest
(`per_iteration_min`). Used by bench/hlo_kernels.py.
"""

import collections
import re
from typing import Dict, List, Tuple

FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "opt-barrier",
        "after-all", "partition-id", "replica-id"}
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"(body|condition|calls|to_apply|true_computation|false_computation)="
                     r"%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


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


def kernels(name: str, computations: Dict[str, List[str]]) -> Dict[str, int]:
  """Counts of `name`'s instructions by kind, and what one call of it runs.

  `per_iteration` counts a conditional's largest branch (an iteration that
  learns, say); `per_iteration_min` its smallest (one that does not).
  """
  counts = collections.Counter(per_iteration=0, per_iteration_min=0)
  totals = ("per_iteration", "per_iteration_min")
  for line in computations[name]:
    rhs = line.split(" = ", 1)[1]
    opcode = _opcode(rhs)
    called = dict(_CALLED.findall(line))
    if opcode in FREE:
      continue
    if opcode == "while":
      counts["while"] += 1
      trips = _TRIPS.search(line)
      body = kernels(called["body"], computations)
      condition = kernels(called["condition"], computations)
      for total in totals:
        counts[total] += (int(trips.group(1)) if trips else 1) * (
            body[total] + condition[total]) + 1
    elif opcode == "conditional":
      counts["conditional"] += 1
      branches = _BRANCHES.search(line)
      names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else
               [called[k] for k in ("true_computation", "false_computation") if k in called])
      runs = [kernels(b, computations) for b in names]
      counts["per_iteration"] += 1 + max(r["per_iteration"] for r in runs)
      counts["per_iteration_min"] += 1 + min(r["per_iteration_min"] for r in runs)
    elif opcode == "call":
      callee = kernels(called["to_apply"], computations)
      for total in totals:
        counts[total] += callee[total]
    else:
      counts["fusion" if opcode == "fusion" else
             "custom-call" if opcode == "custom-call" else "unfused"] += 1
      for total in totals:
        counts[total] += 1
  return dict(counts)


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


def iteration_body(text: str) -> Dict[str, int]:
  """The counts of the body of the entry's longest-running loop (the scan over iterations)."""
  computations, loops = _entry_loops(text)
  if not loops:
    raise SystemExit("No loop in the program's entry computation: nothing to count.")
  best = max(loops, key=_trip_count)
  called = dict(_CALLED.findall(best))
  counts = kernels(called["body"], computations)
  condition = kernels(called["condition"], computations)
  for total in ("per_iteration", "per_iteration_min"):
    counts[total] += condition[total]
  return counts
