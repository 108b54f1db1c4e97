"""How anakin mode lays seeds on devices: the mesh, batched or not, and what must fit.

A run's seeds are split over the local devices (`seed_mesh`); each device
runs its block of seeds (`per_device`), vmapped, or unbatched when it holds
one (`over_seeds`). Before compiling, seeds that could not be independent
runs (`check_independent_seeds`) or whose state cannot fit in memory
(`check_memory`) are refused; after compiling and before running, so are
seeds whose programs' working memory cannot fit (`check_program_memory`).
"""

from typing import Optional

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from acme_jax_dqn import loggers
from acme_jax_dqn import target_updates
from acme_jax_dqn import xla_setup
from agents.dqn.config import SMALLER_NETWORK, ConfigError, DQNConfig
from agents.dqn.experiment_config import ExperimentConfig


def seed_mesh(num_seeds: int, cpu_devices: int, torso: str,
               saved_devices: Optional[int] = None,
               one_cpu_core: bool = False) -> jax.sharding.Mesh:
  """The local devices the seeds are split over: the most, up to a cap, that divide `num_seeds`.

  On the CPU the cap is `cpu_devices`; 0 means one device per seed for
  MLP torsos, and one device for conv torsos or under `one_cpu_core`
  (whose one thread every device would share). Measured on 2 cores: 16
  seeds of the PureJaxRL CartPole preset ran 1.8x as fast on 16 devices
  as on one (tiny ops, one thread each, so seeds on parallel threads
  gain), while 3 MinAtar seeds ran 0.81x as fast on 3 devices (their conv
  ops already use both cores inside one program). A resumed run keeps its
  checkpoint's split (`saved_devices`): another split is another compiled
  program, and the resume would not be exact.
  """
  devices = jax.local_devices()
  if jax.default_backend() == "cpu":
    auto = 1 if one_cpu_core or torso != "mlp" else len(devices)
    wanted = saved_devices or cpu_devices or auto
    if saved_devices and cpu_devices and cpu_devices != saved_devices:
      loggers.warn(f"`cpu_devices`={cpu_devices}, but the checkpoint's run split its seeds "
                   f"over {saved_devices} devices; the resume keeps {saved_devices} (exact "
                   "resume).")
    devices = devices[:wanted]
  count = max(d for d in range(1, len(devices) + 1) if num_seeds % d == 0)
  if cpu_devices and count < min(cpu_devices, num_seeds) and not saved_devices:
    loggers.warn(f"`cpu_devices`={cpu_devices}: the {num_seeds} seeds split evenly over "
                 f"{count} device(s) ({len(jax.local_devices())} exist); pick `num_seeds` a "
                 "multiple of `cpu_devices` to use them all.")
  return jax.sharding.Mesh(np.array(devices[:count]), ("seeds",))


# PRNG implementations whose random bits come from XLA's RngBitGenerator.
RBG_IMPLS = ("rbg", "unsafe_rbg")


def runs_batched(seeds_per_device: int, prng_impl: str) -> bool:
  """Whether a device's block of seeds runs vmapped (`over_seeds`' `batched`).

  One seed per device runs unbatched, except under an RngBitGenerator PRNG:
  there the batched and unbatched programs draw different bits, and a seed
  keeps the stream it had.
  """
  return seeds_per_device > 1 or prng_impl in RBG_IMPLS


def check_independent_seeds(experiment: ExperimentConfig, seed_devices: int) -> None:
  """Refuses an RngBitGenerator PRNG with several seeds vmapped on one device.

  JAX batches `rng_bit_generator` over a vmapped axis of keys by drawing
  every element's bits from the first key (jax 0.10: lax's
  `_rng_bit_generator_batching_rule`), so under `prng_impl`=rbg or
  `unsafe_rbg` the seeds of one program would not each be their own run.
  One seed per device keeps them apart (tests/agents/test_anakin.py shows both).
  """
  per_device = experiment.num_seeds // seed_devices
  if experiment.prng_impl in RBG_IMPLS and per_device > 1:
    raise ConfigError(
        f"`prng_impl`={experiment.prng_impl} with {per_device} seeds on one device "
        f"(`num_seeds`={experiment.num_seeds} over {seed_devices} device(s)): under vmap "
        "JAX draws every seed's random bits from the first seed's key with this PRNG, so "
        "the seeds would not be independent runs. Use `prng_impl`=threefry2x32, or one "
        f"seed per device (on the CPU, `cpu_devices`={experiment.num_seeds}).")


def check_memory(state_shape, mesh: jax.sharding.Mesh, num_seeds: int, config: DQNConfig,
                 eval_shape=None) -> None:
  """Refuses, before compiling, seeds whose training state cannot fit on the devices.

  The state (replay, parameters, optimizer, environments) of every seed
  lives on the device for the whole run, and each evaluation adds its
  episodes in flight (`eval_shape`: one seed's observations and environment
  states at an evaluation, counted twice, for the loop's carry and its
  update); a device holds its block of seeds. The error names the fix for
  the largest part.
  """
  limit = xla_setup.device_memory_bytes(mesh.devices.flat[0])
  if not limit:
    return
  replay = f"replay (`replay_capacity`={config.replay_capacity})"
  buffer = getattr(state_shape, "buffer", None)  # PQN's rollout is working memory (below).
  parts = {replay: xla_setup.nbytes(buffer) / num_seeds} if buffer is not None else {}
  parts["learner"] = xla_setup.nbytes(state_shape.learner) / num_seeds
  window = getattr(state_shape, "window", None)  # The last `n_step` steps of every copy.
  if window is not None and config.n_step > 1:  # (Of one step, it counts as the environments'.)
    parts["n-step window"] = xla_setup.nbytes(window) / num_seeds
  parts["environments"] = xla_setup.nbytes(state_shape) / num_seeds - sum(parts.values())
  parts["evaluation"] = 2 * xla_setup.nbytes(eval_shape)
  fixes = {replay: "a smaller `replay_capacity`",
           "learner": SMALLER_NETWORK,
           "n-step window": "a smaller `n_step` or fewer `num_envs`",
           "environments": "fewer `num_envs`",
           "evaluation": "fewer `eval_episodes`"}
  shares = ", ".join(f"{name} {size / 2**20:,.1f}" for name, size in parts.items())
  _refuse_seeds_over(mesh, num_seeds, limit, sum(parts.values()), "the training state",
                     f"per seed: {shares} MiB", fixes[max(parts, key=parts.get)])


def check_program_memory(compiled, mesh: jax.sharding.Mesh, num_seeds: int,
                         config: DQNConfig, what: str) -> None:
  """Refuses, after compiling `what` and before it runs, seeds its memory cannot hold.

  Besides the state, a program needs working memory that only its
  compiled form knows (XLA's temporaries): for PQN, its rollout and the
  network's activations over it, several times the rollout (more compiled
  for a GPU than for the CPU); for a DQN chunk, its sampled batches.
  `memory_analysis` gives a device's share (one seed on each of two CPU
  devices needs per seed what one seed on one does:
  tests/agents/test_anakin.py). `what`: "initialisation", "training
  chunk" or "evaluation", which decides the fix the error names.
  """
  limit = xla_setup.device_memory_bytes(mesh.devices.flat[0])
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, RuntimeError):  # A backend that does not say.
    return
  if not limit or stats is None:
    return
  # Per seed: a device's share (all devices', where they share the host) over its seeds.
  per_seed = lambda n: n * mesh.size / num_seeds
  temp = per_seed(stats.temp_size_in_bytes)
  if what == "evaluation":
    fix = "fewer `eval_episodes`"
  elif config.pqn:
    fix = "a shorter `pqn_rollout_len` or fewer `num_envs`"
  else:
    fix = "a smaller `batch_size`" if what == "training chunk" else "a smaller `replay_capacity`"
  need = per_seed(stats.argument_size_in_bytes + stats.output_size_in_bytes
                  - stats.alias_size_in_bytes + stats.temp_size_in_bytes)
  _refuse_seeds_over(mesh, num_seeds, limit, need, f"the compiled {what}",
                     f"per seed, {temp / 2**20:,.1f} MiB of it working memory", fix)


def _refuse_seeds_over(mesh: jax.sharding.Mesh, num_seeds: int, limit: int, per_seed: float,
                       what: str, detail: str, fix: str) -> None:
  """The error of the memory checks when `num_seeds` x `per_seed` bytes are over 0.9 `limit`.

  CPU devices share the host's memory; other devices each hold their block.
  """
  shared = mesh.devices.flat[0].platform == "cpu"
  seeds_per_limit = num_seeds if shared else num_seeds // mesh.size
  if per_seed * seeds_per_limit <= 0.9 * limit:
    return
  fits = int(0.9 * limit // per_seed) * (1 if shared else mesh.size)
  gib = lambda n: f"{n / 2**30:.1f} GiB"
  where, holder = ("of host memory", "the host") if shared else ("per device", "a device")
  use = f"Use `num_seeds` <= {fits}, or {fix}." if fits else f"Not one seed fits: use {fix}."
  raise ConfigError(
      f"`num_seeds`={num_seeds}: {what} needs {gib(per_seed * seeds_per_limit)} {where} "
      f"({per_seed / 2**20:,.1f} MiB {detail}) and {holder} holds {gib(limit)}. {use}")


def per_device(fn, mesh, in_specs, out_specs=P("seeds")):
  """`fn` (vmapped over seeds) run on each device's block of seeds, with no cross-device work."""
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def warmup_loops(batched: bool) -> bool:
  """Whether a training chunk runs the learning warm-up as a loop of its own, with no conditional.

  Otherwise a conditional on the iteration index decides, every
  iteration, whether it learns. Over a batch of seeds that conditional
  copies every seed's parameters and optimizer state out of its branch each
  iteration: with 32 seeds vmapped on one CPU device (the PureJaxRL preset,
  100,000 env steps) the loops ran 1.07x the conditional's env steps/s and
  compiled in 5.0 s against 4.3 s. With one seed on a CPU device the
  conditional stays: on two cores XLA's CPU runtime split every call of the
  loops between its two worker threads, and at most half of the
  conditional's, so the loops ran 0.84-0.87x; with the client made on one
  core both ran alike (1.01x; bench/warmup_loops.py counts the split
  calls). On an accelerator the loops run for every seed count: there the
  conditional also waits each iteration for its predicate on the host, and
  compiled for an H200 the iteration that learns runs fewer kernels without
  it (bench/hlo_kernels.py --target=h200). Both structures train the same
  parameters (bench/warmup_loops.py, bench/results/warmup_loops_cpu_*.md).
  """
  return batched or xla_setup.target_platform() != "cpu"


def acting_apart(batched: bool) -> bool:
  """Whether the loop that learns keeps its acting forward apart from the learner's forward.

  XLA's GPU compiler merges matmuls that share an operand into one over the
  concatenated other operands (its dot merger): in the loop that learns,
  layers of the acting forward and of the learner's forward on the same
  online parameters become one matmul (for the PureJaxRL preset, 10 acting
  rows and 128 batch rows). For one seed that saves kernels (an H200
  iteration of that preset runs 78 kernels merged, 81 apart, counted with
  the loops' carry plain; bench/hlo_kernels.py --target=h200). Over 2,048
  vmapped seeds it saves none (69 either way) and the program moves 16% more modelled bytes per
  iteration (4,326 MB against 3,719 MB: concatenations of the inputs and
  slices of the activations), and there a program whose learner sat in a
  conditional's branch of its own, where no merge can reach, ran 1.13x the
  merged one (bench/results/warmup_loops_h200.md). So a batch of seeds on a
  GPU keeps them apart, with an optimization barrier. The computation is
  the same (bit for bit on the CPU, where the compiler merges nothing; a
  GPU may round the separate matmuls differently). On an H200 at 2,048
  seeds the loops kept apart ran 1.16x the merged ones
  (bench/results/warmup_loops_h200_2048_seeds.md).
  """
  return batched and xla_setup.target_platform() == "gpu"


def packed_carry(batched: bool) -> bool:
  """Whether the training loops carry the environments, counters and keys in one word vector
  (`acme_jax_dqn.anakin_loops.carry_scan`): for a block of one seed, not for a batch.

  Packed, XLA copies one vector per iteration where it copied each such
  leaf; compiled for an H200 (bench/hlo_kernels.py --target=h200, the
  PureJaxRL preset), one seed runs 61 kernels per learning iteration
  against 78, and one seed's iteration takes its time from its launches.
  With 2,048 vmapped seeds it saves 8 of 69 kernels where the bytes set
  the time (3,722 MB against 3,719 MB modelled), and the build took about
  2 s longer on a 2-core host (10.6-11.2 s against 8.6-8.7 s; one seed
  0.7-1.7 s longer). The computation is the same, bit for bit on the CPU.
  """
  return not batched


# The traffic of a learner step's target select (reading the online and target parameters and
# writing the target: 3x the target's bytes over a device's seeds) from which the target moves
# in a loop instead: about what an H200 streams in the 10-20 us a host's read of the loop's
# predicate takes. A guess until a GPU times both (bench/target_update.py).
TARGET_LOOP_MIN_BYTES = 64 * 2**20


def target_update_loop(target_bytes: int) -> bool:
  """Whether a device's training chunk moves its target network in a loop that runs only when
  an update is due (`acme_jax_dqn.target_updates.target_update_in_loop`), given the bytes of
  the target parameters of its block of seeds: on an accelerator, where the select would move
  at least `TARGET_LOOP_MIN_BYTES`.

  Otherwise every learner step selects between the new target and the old,
  element by element, reading and writing every seed's target in every
  step. The loop costs every step a test of its predicate, which a GPU's
  host reads: where an iteration's time is its launches (one seed, or a
  few seeds of a small network) that costs more than the select's bytes.
  Compiled for an H200 (bench/hlo_kernels.py --target=h200, the PureJaxRL
  preset, a hard update every 50 steps): 2,048 CartPole seeds (the select
  268.7 MB) run the loop, and a learning iteration with no update due moves
  3,539.6 modelled MB with it against 3,718.7 with the select (1,199.1
  against 1,378.2 with `fused_loss`, whose kernel has since taken the
  gradient norm's read off both); 64 Breakout-MinAtar seeds (the select
  102.9 MB) 1,185.7 against 1,254.0; 64 CartPole seeds (8.4 MB) keep the
  select. The CPU keeps it too: 32 seeds on one CPU device ran 1.01x
  (0.97-1.07x) with the loop (bench/target_update.py). The same values
  either way.
  """
  return (xla_setup.target_platform() != "cpu"
          and 3 * target_bytes >= TARGET_LOOP_MIN_BYTES)


def with_target_loop(fn, target_loop: Optional[bool] = None):
  """`fn(state, ...)` (a device's chunk), traced within `target_updates.target_update_in_loop`
  where `target_loop`; None: where `target_update_loop` picks it for the state's target."""

  def traced(state, *args):
    loop = target_loop
    if loop is None:
      loop = target_update_loop(xla_setup.nbytes(state.learner.target_params))
    if not loop:
      return fn(state, *args)
    with target_updates.target_update_in_loop():
      return fn(state, *args)
  return traced


def over_seeds(fn, batched: bool, in_axes=0):
  """`fn` over a device's block of seeds: vmapped, or (`batched` False) for a block of one seed,
  run unbatched.

  vmap over one seed is not free: the seed's replay writes and reads at
  its own index become scatters and gathers over a batch of one, and the
  program compiles slower. Under threefry the unbatched program draws the
  same random bits as the vmapped one (tests/agents/test_anakin.py).
  """
  if batched:
    return jax.vmap(fn, in_axes=in_axes)
  axes = in_axes if isinstance(in_axes, tuple) else None

  def one_seed(*args):
    args = [a if axes is not None and axes[i] is None else jax.tree.map(lambda x: x[0], a)
            for i, a in enumerate(args)]
    return jax.tree.map(lambda x: x[None], fn(*args))

  return one_seed
