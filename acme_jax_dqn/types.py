"""Data types shared by the kit: transitions and the learner's training state."""

from typing import Any, NamedTuple

import chex
import optax

Params = Any  # A Haiku parameter pytree.


class Transition(NamedTuple):
  """An (n-step) transition as stored in replay.

  `discount` is the full bootstrap multiplier for `next_observation`:
  gamma ** n times the product of the environment discounts along the n steps,
  so it is 0 after a termination and gamma ** n after a time-limit truncation.
  `reward` is the discounted n-step return up to `next_observation`.
  """
  observation: chex.Array
  action: chex.Array
  reward: chex.Array
  discount: chex.Array
  next_observation: chex.Array


class TrainingState(NamedTuple):
  """Everything the learner changes, as one pytree (scans, vmaps, checkpoints)."""
  online_params: Params
  target_params: Params
  opt_state: optax.OptState
  steps: chex.Array  # Learner (SGD) steps taken, int32 scalar (skipped ones included).
  key: chex.PRNGKey
  # The NaN/inf guard: updates with a non-finite loss or gradient are not
  # applied; they are counted, and the first one's learner step is kept
  # (-1 while there is none), so the host can stop or go on (see `sgd_step`).
  nonfinite_updates: chex.Array  # int32 scalar.
  first_nonfinite_step: chex.Array  # int32 scalar.
