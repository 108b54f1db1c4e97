"""Ray for the distributed program: start a private Ray here, or join a cluster's head node."""

import os
import socket
from typing import Dict, List, Optional

import jax

from acme_jax_dqn import xla_setup
from agents.dqn import checkpoints
from agents.dqn.config import ConfigError

NODES_BESIDE_ACTORS = 3  # The replay, the learner and the evaluator.
# Less than any of the kit's node processes holds of its own: a process that has imported Ray
# and the nodes' module holds about 107 MiB (its RssAnon), a CartPole actor node about 133 MiB
# (the learner, which alone imports rlax, about 222 MiB).
NODE_PROCESS_BYTES = 96 * 2**20
# The variable server's process imports Ray and no JAX: about 41 MiB.
VARIABLE_SERVER_BYTES = 32 * 2**20


class NodeCrashed(checkpoints.RunError):
  """A node died, or could not start again, and the run cannot go on without it."""


def refusal(error: Exception) -> Optional[str]:
  """The ConfigError message with which a node's constructor refused the run; else None.

  A node whose constructor raised (at its start, or when Ray restarted it)
  is dead for good: Ray does not try it again. Ray's ActorDiedError then
  holds the constructor's traceback as text, not the exception, so the
  message is read from its last line.
  """
  if not getattr(error, "actor_init_failed", False):
    return None
  prefix = f"{ConfigError.__module__}.{ConfigError.__qualname__}: "
  last = str(error).strip().splitlines()[-1].strip()
  return last[len(prefix):] if last.startswith(prefix) else None


def start_failure(error: Exception) -> str:
  """One line on why a node could not start: its refusal, or its error's last line."""
  return refusal(error) or str(error).strip().splitlines()[-1].strip()[:300]


def wait_for_nodes(ray, nodes: Dict[str, List]) -> None:
  """Waits until every node has started: one that refused the run gives a ConfigError.

  `nodes`: {what to call one of them ("the learner node"): their handles}. A
  node that failed to start for another reason gives NodeCrashed, with its
  error's last line.
  """
  for name, handles in nodes.items():
    try:
      ray.get([handle.__ray_ready__.remote() for handle in handles])
    except ray.exceptions.RayActorError as error:
      message = refusal(error)
      if message is not None:
        raise ConfigError(f"{name} refused the run on its Ray host: {message}") from None
      raise NodeCrashed(f"{name[0].upper()}{name[1:]} could not start ({start_failure(error)}). "
                        "See the Ray logs under /tmp/ray/session_latest/logs.") from None


def check_address(address: str, timeout_s: float = 3.0) -> None:
  """A clear error within seconds when HOST:PORT does not answer (ray.init would wait long)."""
  if address in ("auto", "local") or address.startswith("ray://"):
    return
  host, sep, port = address.rpartition(":")
  if not sep or not port.isdigit():
    raise ConfigError(f"`ray_address`={address!r}: expected HOST:PORT of a Ray head node "
                      "(as printed by `ray start --head`), or empty to start Ray here.")
  try:
    with socket.create_connection((host, int(port)), timeout=timeout_s):
      pass
  except OSError as error:
    raise ConfigError(
        f"`ray_address`={address}: no Ray head node answers there ({error}). Start one "
        "with `ray start --head --port=6379` on that machine, check the address and "
        "firewall, or drop `ray_address` (and unset RAY_ADDRESS) to run on this "
        "machine.") from None


def check_node_processes(num_actors: int, limit: Optional[int] = None) -> None:
  """Refuses more node processes than this host's memory holds, for a Ray started here.

  Every node is a process: the kit's nodes are counted at
  `NODE_PROCESS_BYTES` each and the variable server at
  `VARIABLE_SERVER_BYTES`, less than any holds: only setups that cannot
  fit are refused.
  """
  limit = xla_setup.host_memory_bytes() if limit is None else limit
  processes = num_actors + NODES_BESIDE_ACTORS + 1  # And the variable server.
  need = (num_actors + NODES_BESIDE_ACTORS) * NODE_PROCESS_BYTES + VARIABLE_SERVER_BYTES
  if limit and need > 0.9 * limit:
    most = (int(0.9 * limit) - VARIABLE_SERVER_BYTES) // NODE_PROCESS_BYTES - NODES_BESIDE_ACTORS
    fix = (f"Use `num_actors` <= {most}, or a cluster (`ray_address`)." if most >= 1 else
           "Not one actor fits beside the other nodes here: use a cluster (`ray_address`).")
    raise ConfigError(
        f"`num_actors`={num_actors}: a Ray started on this machine runs every node as a "
        f"process, and {processes:,} of them (the actors, the replay, the learner and the "
        f"evaluator at {NODE_PROCESS_BYTES // 2**20} MiB each, the variable server at "
        f"{VARIABLE_SERVER_BYTES // 2**20} MiB, less than any node holds) need at least "
        f"{need / 2**30:,.1f} GiB and the host holds {limit / 2**30:.1f} GiB. {fix}")


def check_learner_gpus(ray, count: int) -> None:
  """Refuses `learner_gpus`=count where no node of the cluster has that many GPUs (Ray would
  wait for one without end)."""
  most = max((node["Resources"].get("GPU", 0) for node in ray.nodes() if node["Alive"]),
             default=0)
  if most < count:
    raise ConfigError(
        f"`learner_gpus`={count}: no machine of the Ray cluster has {count} GPU (the most on "
        f"one: {most:g}). Use `learner_gpus`=0, or join a cluster with a GPU machine "
        "(`ray_address`).")


def start_ray(address: str, compilation_cache_dir: str = ""):
  """(ray, whether this call started it): joins `address`, or starts a private Ray here.

  A Ray started here gives its nodes the driver's compilation cache
  (`compilation_cache_dir`; they share this machine's disk). A cluster's
  nodes, on other machines, compile without one.
  """
  try:
    import ray  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ConfigError("`run_mode`=distributed runs on Ray, which is not installed: "
                      "pip install -e '.[distributed]' (or pip install 'ray>=2.9').") from None
  # The nodes' processes make their keys with the run's PRNG (`prng_impl`), which
  # JAX reads from this variable at import; set always, so that a value the
  # driver's environment exports cannot reach the nodes instead.
  runtime_env = {"env_vars": {"JAX_DEFAULT_PRNG_IMPL": jax.config.jax_default_prng_impl}}
  if address:
    check_address(address)
    ray.init(address=address, log_to_driver=False, configure_logging=False,
             runtime_env=runtime_env)
    return ray, False
  os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # A private Ray on this machine.
  # Ray would start a worker per CPU for the first driver's tasks; every node here is an
  # actor in a process of its own, so they would only sit idle (about 80 MB each, and CPU
  # while the nodes start: a tiny run's compile_s 13.0 s against 13.7 s on 2 cores).
  os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
  runtime_env["env_vars"].update(xla_setup.compilation_cache_env(compilation_cache_dir))
  # address="local": a new instance even when another process's Ray runs here
  # (ray.init() with no address would connect to that one).
  ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
           log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
  return ray, True
