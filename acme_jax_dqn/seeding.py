"""A run's random streams, each derived from the run's one seed by NumPy's SeedSequence.

Every stream has a path of small integers (`Stream`, then indices such as
an actor's number or an environment copy's). Its seed is the first word of
`np.random.SeedSequence(seed, spawn_key=path)`, a hash of the run seed and
the path, so streams of one run, and of runs with neighbouring seeds, do
not share a seed the way `seed + offset` schemes do (where seed 0's second
environment copy is seed 1's first).
"""

import enum
from typing import Sequence

import jax
import numpy as np

from acme_jax_dqn import xla_setup


class Stream(enum.IntEnum):
  """The independent random streams of a run (the first element of a path)."""
  TRAIN_ENVS = 1  # The local training environments (copy i: its seed spawned by the batch).
  EVAL_ENV = 2  # The evaluation environment (local and distributed modes).
  ACTOR_ENVS = 3  # A distributed actor node's environments: (ACTOR_ENVS, actor[, life]).
  ACTOR = 4  # A distributed actor node's exploration key: (ACTOR, actor[, life]).
  EVALUATOR = 5  # The distributed evaluator's policy key.
  REPLAY = 6  # The distributed replay node's sampling key.
  EVAL_KEYS = 7  # Anakin mode's evaluation key of each seed.


def derive_seed(seed: int, *path: int) -> int:
  """A seed in [0, 2**31) for the stream at `path` under the run seed `seed`.

  31 bits, so that every consumer takes it (envpool wants an int32).
  """
  if seed < 0:
    raise ValueError(f"seed must be 0 or positive, got {seed}.")
  sequence = np.random.SeedSequence(int(seed), spawn_key=tuple(int(p) for p in path))
  return int(sequence.generate_state(1, np.uint32)[0] >> 1)


def derive_key(seed: int, *path: int) -> jax.Array:
  """`jax.random.PRNGKey` of `derive_seed(seed, *path)`."""
  return jax.random.PRNGKey(derive_seed(seed, *path))


def key_shape() -> jax.ShapeDtypeStruct:
  """The shape and dtype of a key of the implementation in force, traced: nothing runs.

  (A fresh function each call: JAX's trace cache does not key on the implementation.)
  """
  return jax.eval_shape(lambda: jax.random.PRNGKey(0))


def keys_of(seeds: Sequence[int]) -> np.ndarray:
  """`jax.random.PRNGKey(s)` of each seed, stacked on the host: [len(seeds), key words].

  Many seeds that fit in int32 take one compiled call, with the same keys
  (one by one, each key is a dispatch and a copy back, which for thousands
  of seeds delays every compile of a run); a few, or larger ones, go one by
  one. The key implementation is the one in force (`xla_setup.prng_impl`). They are
  made on the host's CPU device (`xla_setup.on_host`), whatever the default device.
  """
  with xla_setup.on_host():
    if len(seeds) > 64 and all(0 <= s < 2**31 for s in seeds):
      # A fresh jit each call: JAX's jit cache does not key on the PRNG implementation.
      return np.asarray(jax.jit(jax.vmap(jax.random.PRNGKey))(np.asarray(seeds, np.int32)))
    return np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])


def copy_seeds(seed: int, count: int) -> list:
  """Seeds of `count` environment copies stepped together, from the batch's seed."""
  return [derive_seed(seed, index) for index in range(count)]
