"""The run's anakin programs built once in a process, to be called again and again by benches.

`programs` compiles init and the chunk programs of the command's run flags
for a block of seeds on one device (one seed unbatched, more vmapped, as
`launch.run_dqn` lays out a device's block), once per variant: the chunk
structure (warm-up as loops of its own or a conditional, acting apart, the
carry packed or plain) and XLA compiler options of that program's compile alone (init compiles once,
with XLA's defaults, and every run includes it). `timed_rounds` calls them
in turn; bench/warmup_loops.py, bench/compiler_options.py, bench/packed_carry.py and
bench/target_update.py time them (the last two through `compare_pair`).
`parse_options` reads compiler options as bench/compiler_options.py takes
them. Each program's module is named for what it is (`init`, `chunk_warmup_<n>`, or
`chunk_conditional` where a conditional decides each iteration's learning), so that a
profiler's trace tells their kernels apart (bench/kernel_times.py).
"""

import functools
import statistics
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import jax
import numpy as np

from acme_jax_dqn import checkpointing
from acme_jax_dqn import envs
from acme_jax_dqn import seeding
from acme_jax_dqn import xla_setup
from agents.dqn import seed_layout
from agents.dqn.anakin import AnakinPlan
from agents.dqn.builder import DQNBuilder
from bench import harness
from bench import hlo_count


class Variant(NamedTuple):
  """How a chunk program is built: the warm-up as loops of its own, acting apart, the loops'
  carry packed (`acme_jax_dqn.anakin_loops.carry_scan`), the target update in a loop
  (`agents.dqn.seed_layout.target_update_loop`; these four None: the run's default for the
  layout), XLA compiler options of its compile (None: XLA's defaults), replay items stored
  packed (`acme_jax_dqn.replay.PackedItems`; None: the run's default, packed), the
  environment's single-index scatters as selects (`acme_jax_dqn.envs.scatter_selects`;
  None: the run's default, selects on an accelerator and gymnax's scatters on the CPU)."""
  loops: Optional[bool] = None
  apart: Optional[bool] = None
  options: Optional[Dict[str, Any]] = None
  packed: Optional[bool] = None
  target_loop: Optional[bool] = None
  items: Optional[bool] = None
  selects: Optional[bool] = None


STRUCTURES = {"conditional": Variant(False, False), "loops": Variant(True, False),
              "loops apart": Variant(True, True)}
DEFAULT = "default"
RUN_DEFAULT = {DEFAULT: Variant()}  # The structure and options a run gets.


class Program(NamedTuple):
  """One variant's programs: their compile seconds (the chunks'), `run()` and the optimized HLO
  texts of init and of each chunk program."""
  compile_s: float
  run: Callable[[], Tuple]
  texts: List[str]


def named(fn, name: str):
  """`fn` under another name, which `jax.jit` gives the program's module (its signature kept,
  so the program's parameters keep their names too)."""
  @functools.wraps(fn)
  def renamed(*args):
    return fn(*args)
  renamed.__name__ = renamed.__qualname__ = name
  return renamed


def programs(experiment, config, num_seeds: int, variants=None):
  """({name: Program} for each of `variants` (default `STRUCTURES`), the plan, the warm-up
  iterations); a Program's run() is init and every chunk of the plan, -> (params, metric rows)."""
  env = envs.make_jax_environment(experiment.env)
  builder = DQNBuilder(config)
  networks = builder.make_networks(env.spec, experiment.env)
  batched = seed_layout.runs_batched(num_seeds, experiment.prng_impl)
  keys = seeding.keys_of([experiment.seed + i for i in range(num_seeds)])  # As run_dqn's.
  built = {}

  def build(items: bool, selects: Optional[bool]):
    """(trainer, compiled init, state shape), once per replay item layout and scatter form."""
    if selects is None:  # The run's own form for this backend.
      selects = env.uses_selects()
    if (items, selects) not in built:
      trainer = builder.make_anakin(env._replace(scatters_as_selects=selects), networks,
                                    experiment.eval_episodes, packed_items=items)
      init_fn = jax.jit(named(seed_layout.over_seeds(trainer.init, batched), "init"))
      built[items, selects] = (trainer, init_fn.lower(keys).compile(),
                               jax.eval_shape(init_fn, keys))
    return built[items, selects]

  plan = AnakinPlan(build(True, None)[0], config, experiment)
  out = {}
  for name, (loops, apart, options, packed, target_loop, items, selects) in (
      variants or STRUCTURES).items():
    trainer, init, state_shape = build(items is not False, selects)
    if loops is None:
      loops = seed_layout.warmup_loops(batched)
    warmups = plan.chunk_warmups(trainer, loops)
    compiled, start = {}, time.perf_counter()
    for warmup in dict.fromkeys(warmups):
      chunk = named(plan.chunk_fn(trainer, warmup, batched, acting_apart=apart,
                                  packed_carry=packed, target_loop=target_loop),
                    "chunk_conditional" if warmup is None else f"chunk_warmup_{warmup}")
      compiled[warmup] = jax.jit(chunk, donate_argnums=0).lower(state_shape, np.int32(0)).compile(
                                     compiler_options=options or None)
    compile_s = time.perf_counter() - start

    def run(compiled=compiled, warmups=warmups, init=init):
      state, rows = init(keys), []
      for c, warmup in enumerate(warmups):
        state, metrics = compiled[warmup](state, np.int32(c * plan.iterations_per_chunk))
        rows.append(jax.device_get(metrics))
      return jax.device_get(state.learner.online_params), rows

    out[name] = Program(compile_s, run, [init.as_text()] + [c.as_text() for c in
                                                             compiled.values()])
  return out, plan, trainer.warmup_iterations


def timed_rounds(progs, repeats: int, cpu: Optional[Dict[str, list]] = None
                 ) -> Tuple[Dict[str, List[float]], Dict[str, tuple]]:
  """({name: [seconds of each timed round]}, {name: the last run's result}): every program of
  `progs` (from `programs`) called once per round, `repeats` timed rounds after an untimed
  warm-up round; the order turns by one each round, so no program always runs first. `cpu`,
  where given, gets each timed call's (CPU s of the busiest thread, of the others) by name
  (`harness.timed_call`; None where /proc is not there)."""
  names = list(progs)
  times, results = {name: [] for name in names}, {}
  for repeat in range(repeats + 1):
    turn = repeat % len(names)
    for name in names[turn:] + names[:turn]:
      seconds, results[name], threads = harness.timed_call(progs[name].run)
      if repeat:
        times[name].append(seconds)
        if cpu is not None:
          cpu.setdefault(name, []).append(threads)
  return times, results


def split_calls(cpu_of_calls: List[Optional[tuple]]) -> str:
  """How many calls XLA split between worker threads ("k of n"): the other threads took at
  least a quarter of the call's CPU time (on one thread they take a few percent)."""
  known = [c for c in cpu_of_calls if c is not None]
  if not known:
    return "n/a"
  split = sum(1 for busiest, rest in known if rest >= (busiest + rest) / 4)
  return f"{split} of {len(known)}"


def compare_pair(experiment, config, counts: List[int], repeats: int, variants, caption: str,
                 out: str) -> None:
  """Times two variants (`{name: Variant}`, the baseline first) of the run's chunk programs at
  each of `counts` seeds on one device, called in turn (`timed_rounds`), and writes the table to
  `out`: each program's kernels per iteration and modelled MB of an iteration that learns with
  no update due (`hlo_count`, the loop with the most iterations of its last chunk program), its
  compile and run seconds, the median of the rounds' ratios (env steps/s, the second over the
  first) and whether both trained the same parameters. `caption` says what the two are."""
  first, second = variants

  def counted(program: Program) -> str:
    body = hlo_count.iteration_body(program.texts[-1])
    return (f"{body['per_iteration']} ({body['copy']} copies), "
            f"{body['bytes_per_iteration_not_due'] / 1e6:,.1f} MB")

  table = harness.PrintedTable(
      ["seeds", f"kernels per iteration (top-level copies), MB with no update due, {first}",
       second,
       f"compile s ({first}, {second})", f"{first} s", f"{second} s",
       f"{second} / {first} (env steps/s)", "same params"], summary=harness.jax_here())
  medians = []
  for num_seeds in counts:
    with xla_setup.prng_impl(experiment.prng_impl):
      progs, plan, _ = programs(experiment, config, num_seeds, variants)
      times, results = timed_rounds(progs, repeats)
    ratios = [a / b for a, b in zip(times[first], times[second])]
    medians.append(statistics.median(ratios))
    same = len({checkpointing.params_checksum(r[0]) for r in results.values()}) == 1
    table.add(
        f"| {num_seeds} | {counted(progs[first])} | {counted(progs[second])} | "
        f"{progs[first].compile_s:.1f}, {progs[second].compile_s:.1f} | "
        f"{statistics.median(times[first]):.2f} | {statistics.median(times[second]):.2f} | "
        f"{medians[-1]:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"{'yes' if same else 'NO'} |")
  table.close(
      out,
      f"compared: the run's chunk programs for the command's run flags, {plan.num_chunks} "
      f"chunk(s) of {plan.iterations_per_chunk:,} iterations ({plan.env_steps:,} env steps per "
      f"seed), {caption}, then called in turn, {repeats} timed rounds per seed count after a "
      f"warm-up round; the medians of the rounds' ratios, {second} / {first}: "
      + ", ".join(f"{n} seed(s) {m:.2f}x" for n, m in zip(counts, medians)) + ".")


Options = Dict[str, Union[bool, str]]


def parse_options(text: str) -> Dict[str, Options]:
  """{label: options} from 'a=1 b=true;c=x,y': semicolons between option sets, spaces between
  an option set's name=value pairs. true/false become bools; XLA parses every other value for
  its option's type. Raises ValueError, naming the part, on a malformed or repeated pair."""
  variants = {}
  for label in filter(None, (v.strip() for v in text.split(";"))):
    if label in variants:
      raise ValueError(f"'{label}' is given twice")
    options = {}
    for pair in label.split():
      name, sep, value = pair.partition("=")
      if not sep or not name:
        raise ValueError(f"'{pair}' is not name=value")
      if name in options:
        raise ValueError(f"'{name}' is set twice in '{label}'")
      options[name] = value.lower() == "true" if value.lower() in ("true", "false") else value
    variants[label] = options
  return variants


def refused(lowered, options: Options) -> Optional[str]:
  """The first line of XLA's refusal to compile `lowered` (a small program) with `options`, or
  None where it compiles: an option XLA does not know, or a value it cannot read."""
  try:
    lowered.compile(compiler_options=options)
  except Exception as error:  # pylint: disable=broad-except
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  return None


def refusal_hint(first_line: str) -> str:
  """What to change, for `refused`'s line."""
  return ("name options as XLA_FLAGS does, without the leading --"
          if "No such compile option" in first_line else "give a value of the option's type")
