"""XLA and JAX settings of a run: CPU dispatch, compilation cache, CPU devices, CPU threads,
one core, PRNG, and the platform the programs are built for.

Most must be made before JAX creates its CPU client (the first array or
device query); each says so, and returns False when it is too late.
"""

import contextlib
import functools
import os
from typing import Any, Dict, Optional, Tuple

import jax


def use_synchronous_cpu_dispatch() -> None:
  """Runs jitted CPU computations on the calling thread.

  Python loops that call small jitted functions and read their results
  every step (acting, then stepping the env) otherwise wait for the
  hand-off to JAX's async CPU worker. JAX reads this setting when it
  creates the CPU client, so call this before the first array is made;
  later it has no effect. It does not touch GPU or TPU execution.
  """
  jax.config.update("jax_cpu_enable_async_dispatch", False)


def configure_cpu_dispatch(num_envs: int) -> None:
  """Synchronous CPU dispatch for one env, JAX's async default for batched envs.

  Measured with bench/speed.py on 2 cores: one env ran at 3,844 env steps/s
  synchronous against 3,015-3,500 async; 8 envs at 6,616-6,671 async
  against 5,400-5,583 synchronous (async lets host work between calls
  overlap the learner step).
  """
  if num_envs == 1:
    use_synchronous_cpu_dispatch()


def enable_compilation_cache(path: str) -> None:
  """Keeps compiled XLA programs on disk under `path`, so a rerun skips compiling.

  JAX's persistent compilation cache: a second run of the same program
  (same config, shapes and jax version) loads it instead of compiling it,
  which on this 2-core CPU turns seconds of compile into a fraction of one.
  An empty `path` leaves the cache off.
  """
  for name, value in _cache_settings(path).items():
    jax.config.update(name, value)


def compilation_cache_env(path: str) -> Dict[str, str]:
  """`enable_compilation_cache(path)` as environment variables, for processes started with them.

  JAX reads each setting from its upper-case variable at import, so the Ray
  nodes of a distributed run on this machine share the driver's cache: a
  rerun loads their programs instead of compiling them. Empty when `path` is.
  """
  return {name.upper(): str(value) for name, value in _cache_settings(path).items()}


def _cache_settings(path: str) -> Dict[str, Any]:
  if not path:
    return {}
  path = os.path.expanduser(path)
  os.makedirs(path, exist_ok=True)
  return {"jax_compilation_cache_dir": path, "jax_persistent_cache_min_compile_time_secs": 0.2,
          "jax_persistent_cache_min_entry_size_bytes": 0}


MAX_AUTO_CPU_DEVICES = 64


def set_cpu_devices(count: int) -> bool:
  """Gives JAX's CPU client `count` devices, so that sharded programs run on parallel threads.

  An anakin run splits its seeds over the local devices (agents/dqn/anakin.py):
  on the CPU each device runs its block of seeds as its own program, on
  its own thread. On 2 cores, 16 seeds of the PureJaxRL preset (batch 128,
  120-84 MLP) ran at 25,964 env steps/s after compiling as one vmapped
  program on 1 device and 47,269 on 16 (bench/seeds_scale.py). Must run
  before the CPU client exists; returns False, changing nothing, after,
  and when XLA_FLAGS sets --xla_force_host_platform_device_count (the
  user's count stands). It does not touch GPU or TPU devices.
  """
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if (xla_bridge.backends_are_initialized()
      or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
    return False
  jax.config.update("jax_num_cpu_devices", max(1, count))
  return True


_TARGET_PLATFORM = None  # Set by `building_for`; None: the default backend's.


def target_platform() -> str:
  """The platform ("cpu", "gpu", "tpu") the programs traced now are built for.

  The kit picks some program structures by platform (a select or a
  conditional, convolutions as patch matmuls, the learning warm-up as its
  own loop, an environment's scatters as selects); they ask here. It is
  JAX's default backend, except within `building_for`.
  """
  return _TARGET_PLATFORM or jax.default_backend()


def host_device():
  """The host's CPU device; where JAX runs without its CPU backend (`JAX_PLATFORMS=cuda`), the
  default device."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # "Unknown backend cpu".
    return jax.devices()[0]


def on_host():
  """Within the block, JAX's eager operations run on the host's CPU device.

  A run's setup makes a few small arrays eagerly (keys, an environment's
  spaces). Each new operation is a compile for the device it runs on: on a
  GPU a compile through LLVM and ptxas, on the CPU a fraction of that. The
  results are read back to the host anyway. Where JAX runs without its CPU
  backend (`JAX_PLATFORMS=cuda`), they stay on the default device.
  """
  try:
    return jax.default_device(jax.local_devices(backend="cpu")[0])
  except RuntimeError:  # "Unknown backend cpu".
    return contextlib.nullcontext()


@contextlib.contextmanager
def building_for(platform: str):
  """Within the block, programs are traced as for `platform`: to compile them ahead of time
  for a device this host does not have (bench/hlo_kernels.py --target).

  JAX's jit cache does not key on it: a function jitted and traced before
  the block would keep that trace; jit the functions anew inside it.
  """
  global _TARGET_PLATFORM  # pylint: disable=global-statement
  previous, _TARGET_PLATFORM = _TARGET_PLATFORM, platform
  try:
    yield
  finally:
    _TARGET_PLATFORM = previous


@contextlib.contextmanager
def prng_impl(name: str):
  """Within the block, keys made without an explicit implementation use JAX's `name`.

  `jax.random.PRNGKey(seed)` then gives `name`'s raw key (uint32[2] for
  threefry2x32, uint32[4] for rbg and unsafe_rbg) and every split, fold and
  draw on it traces with that implementation. The earlier default comes back
  on exit, so a run embedded in a longer process leaves it as it was. JAX's
  jit cache does not key on this setting: a jitted function kept across
  runs with different implementations but same-shaped keys (rbg and
  unsafe_rbg) would keep the first; the kit makes its jitted functions
  per run.
  """
  previous = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", name)
  try:
    yield
  finally:
    jax.config.update("jax_default_prng_impl", previous)


def run_xla_on_one_cpu_core() -> bool:
  """Creates JAX's CPU client while this thread may run on one core only, then lifts the limit.

  The client sizes its thread pools from the CPU affinity at creation, so
  XLA then executes (and compiles) on one thread. On this 2-core machine
  gave the compiled anakin loop 1.1-1.5x more steps/s (no hand-offs
  between two worker threads every iteration) and a 1.6x slower cold
  compile (bench/speed.py --mode=anakin). Returns False, changing nothing, when
  the client already exists or the platform has no CPU affinity.
  """
  if one_cpu_core_blocked():
    return False
  allowed = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {min(allowed)})
  try:
    jax.devices()
  finally:
    os.sched_setaffinity(0, allowed)  # Python and later host threads use every core again.
  return True


def keep_jax_on_cpu() -> bool:
  """Restricts JAX in this process to its CPU backend (`jax_platforms`="cpu") before the
  backend starts: for the processes of a distributed run other than its learner (the driver
  that launch.run_dqn starts, the actors, the evaluator and the replay), whose arrays are
  small or belong in the host's memory. On a GPU host each of them would otherwise start a
  GPU client, and XLA preallocates most of the GPU's memory for each, which the learner node
  needs. Returns False, changing
  nothing, when JAX's backends exist already or `jax_platforms` (JAX_PLATFORMS) names
  platforms. The setting lasts as long as the process."""
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge.backends_are_initialized() or jax.config.jax_platforms:
    return False
  jax.config.update("jax_platforms", "cpu")
  return True


def one_cpu_core_blocked() -> bool:
  """Whether `run_xla_on_one_cpu_core` would change nothing now: the client exists, or the
  platform sets no CPU affinity."""
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  return xla_bridge.backends_are_initialized() or not hasattr(os, "sched_setaffinity")


_CPU_THREADS_SET = None  # The CPU client's workers where `set_cpu_threads` made it; None: XLA's.


def set_cpu_threads(count: int) -> bool:
  """Creates JAX's CPU client now with `count` worker threads (at least one per CPU device).

  XLA sizes the client's intra-op and dispatch pools from `PJRT_NPROC`
  (else `NPROC`, else one thread per core) when it creates the client; the
  variable is set for that moment only, so processes started later keep
  XLA's default. With more than one worker, XLA's CPU executor hands half
  of a loop body's ready operations to another worker whenever more than 8
  are ready, and the loop then runs split between two threads: on 2 cores
  PureJaxRL's dqn.py loop was split in every call and took 1.1-1.2x as long
  as on one thread, the kit's anakin loop now and then (bench/steady_speed.py).
  Compiling is not slowed (unlike `run_xla_on_one_cpu_core`). Returns
  False, changing nothing, where `cpu_threads_blocked` gives a reason.
  """
  global _CPU_THREADS_SET  # pylint: disable=global-statement
  if cpu_threads_blocked():
    return False
  os.environ["PJRT_NPROC"] = str(count)
  try:
    cpu_devices = len(jax.devices("cpu"))
  finally:
    del os.environ["PJRT_NPROC"]
  _CPU_THREADS_SET = max(count, cpu_devices)  # XLA gives each CPU device a thread at least.
  return True


def cpu_threads_blocked() -> Optional[str]:
  """Why `set_cpu_threads` would change nothing now, or None: the client exists, the user's
  `PJRT_NPROC` or `NPROC` stands, or JAX could find a GPU or TPU plugin here (its client would
  read the same variable; also on a machine without that device)."""
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge.backends_are_initialized():
    return "JAX's CPU client exists already in this process"
  for name in ("PJRT_NPROC", "NPROC"):
    if name in os.environ:
      return f"{name}={os.environ[name]} is set, and XLA takes its count from it"
  if _accelerator_plugins():
    return ("a GPU or TPU plugin of JAX is installed, whose client would read the same "
            "setting (JAX_PLATFORMS=cpu runs on the CPU alone)")
  return None


def cpu_threads_set() -> Optional[int]:
  """The worker threads the CPU client has where `set_cpu_threads` created it, or None."""
  return _CPU_THREADS_SET


def _accelerator_plugins(jax_platforms: Optional[str] = None) -> bool:
  """Whether JAX may start a GPU or TPU client here: `jax_platforms` (default: JAX's setting)
  names another platform, or, where it names none, a plugin is installed."""
  if jax_platforms is None:
    jax_platforms = jax.config.jax_platforms or ""
  platforms = {p.strip().lower() for p in jax_platforms.split(",")} - {""}
  if platforms:
    return platforms != {"cpu"}
  return _plugins_installed()


@functools.lru_cache(maxsize=None)  # Installed packages stay as they are within a process.
def _plugins_installed() -> bool:
  """Whether a `jax_plugins` module or entry point, or libtpu, is installed."""
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  import pkgutil  # pylint: disable=import-outside-toplevel
  try:
    import jax_plugins  # pylint: disable=import-outside-toplevel
    if any(pkgutil.iter_modules(jax_plugins.__path__)):
      return True
  except ImportError:
    pass
  return bool(importlib.metadata.entry_points(group="jax_plugins")
              or importlib.util.find_spec("libtpu"))


def device_memory_bytes(device) -> Optional[int]:
  """What one device can hold: its allocator's limit, or the host's memory for a CPU device."""
  stats = device.memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  return host_memory_bytes() if device.platform == "cpu" else None


def host_memory_bytes() -> Optional[int]:
  """This machine's physical memory (None where the OS does not say); starts no JAX backend."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    return None


def memory_for_buffers(on_host: bool = False) -> Tuple[Optional[int], str]:
  """(bytes, "the host" or "the device") that this process's default device holds.

  A CPU device holds the host's memory. With `on_host`, the host's memory
  as the OS says, starting no JAX backend (a driver that only plans).
  """
  if on_host:
    return host_memory_bytes(), "the host"
  device = jax.local_devices()[0]
  return device_memory_bytes(device), "the host" if device.platform == "cpu" else "the device"


def size_text(num_bytes: int) -> str:
  """`num_bytes` in GiB, or in MiB below one GiB ("8.0 GiB", "15.3 MiB")."""
  if num_bytes >= 2**30:
    return f"{num_bytes / 2**30:.1f} GiB"
  return f"{num_bytes / 2**20:.1f} MiB"


def nbytes(tree) -> int:
  """Bytes of a tree of arrays or of their shapes (`jax.eval_shape`'s output); None counts 0."""
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
