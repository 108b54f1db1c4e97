"""Samples per insert: how many learner calls the inserted items allow, in every run mode.

One rule serves the three modes. After `inserted` items, of which the
first `min_size` only fill the replay, the learner has made

    calls_due(inserted) = floor((inserted - min_size) * samples_per_insert / samples_per_call)

calls of `samples_per_call` sampled items each (none before `min_size`).

- The local loop runs exactly `calls_due` calls after each env step.
- The compiled anakin iteration has a static shape: it steps `env_steps`
  times and then makes `calls` calls. `iteration_shape` picks the
  smallest whole iteration over which the rule gives whole calls, so the
  anakin ratio equals the local one (its calls start with the iteration
  that fills `min_size`, one iteration's calls ahead of the rule); when no
  iteration is small enough it rounds, and `ratio_warning` says what runs.
- The distributed replay (`SampleToInsertRatio`, Reverb's limiter of that
  name) lets samples run ahead of or behind the rule by `error_buffer`
  items, since actors and learner run at their own pace.
"""

import math
from typing import Optional, Tuple

# Longest anakin iteration (env steps) tried for an exact ratio before rounding.
MAX_EXACT_ITERATION = 32


def calls_due(inserted: int, min_size: int, samples_per_insert: float,
              samples_per_call: int) -> int:
  """Learner calls the rule allows after `inserted` items (0 before `min_size`)."""
  learnable = inserted - min_size
  if learnable < 0:
    return 0
  return int(learnable * samples_per_insert // samples_per_call)


def iteration_shape(samples_per_call: int, samples_per_insert: float,
                    num_envs: int) -> Tuple[int, int]:
  """(env steps, learner calls) of one anakin iteration; each env step inserts `num_envs` items.

  The smallest whole iteration (at most `MAX_EXACT_ITERATION` env steps)
  whose items are worth whole calls under `calls_due`; when there is none,
  the nearest rounding of one call's worth (or of the calls per env step).
  """
  calls_per_env_step = num_envs * samples_per_insert / samples_per_call
  for env_steps in range(1, MAX_EXACT_ITERATION + 1):
    calls = calls_per_env_step * env_steps
    if calls >= 1 and math.isclose(calls, round(calls), rel_tol=0, abs_tol=1e-9):
      return env_steps, int(round(calls))
  if calls_per_env_step <= 1:
    return max(1, round(1 / calls_per_env_step)), 1
  return 1, max(1, round(calls_per_env_step))


def kept_samples_per_insert(samples_per_call: int, num_envs: int, env_steps: int,
                            calls: int) -> float:
  """The samples-per-insert ratio an iteration of this shape keeps."""
  return samples_per_call * calls / (env_steps * num_envs)


def ratio_warning(batch_size: int, num_sgd_steps: int, samples_per_insert: float,
                  num_envs: int, tolerance: float = 0.05) -> Optional[str]:
  """A one-line warning when whole iterations cannot keep `samples_per_insert` within 5%.

  Returns None when the kept ratio is close enough. The message names the
  fields and values that would make the ratio exact.
  """
  per_call = batch_size * num_sgd_steps
  env_steps, calls = iteration_shape(per_call, samples_per_insert, num_envs)
  kept = kept_samples_per_insert(per_call, num_envs, env_steps, calls)
  if abs(kept - samples_per_insert) <= tolerance * samples_per_insert:
    return None

  def exact(envs):
    return math.isclose(kept_samples_per_insert(per_call, envs, *iteration_shape(
        per_call, samples_per_insert, envs)), samples_per_insert, rel_tol=1e-9)

  exact_envs = [e for e in range(1, 4 * num_envs + 9) if exact(e)]
  fixes = [f"`samples_per_insert`={kept:g} (what runs)"]
  if exact_envs:
    fixes.insert(0, f"`num_envs`={min(exact_envs, key=lambda e: abs(e - num_envs))}")
  return (f"anakin mode keeps samples per insert at {kept:.4g}, not "
          f"`samples_per_insert`={samples_per_insert:g}: each iteration steps "
          f"`num_envs`={num_envs} copies {env_steps} time(s) and takes {calls} learner "
          f"call(s) of `batch_size`={batch_size} x `num_sgd_steps_per_step`={num_sgd_steps}. "
          f"For an exact ratio use {' or '.join(fixes)}.")


def error_buffer(samples_per_call: int, samples_per_insert: float, num_actors: int,
                 insert_batch: int) -> float:
  """Room for every actor's batch in flight and a few learner calls."""
  return max(samples_per_call * 2.0, samples_per_insert * insert_batch * num_actors * 1.5)


class SampleToInsertRatio:
  """Inserts and samples kept within `error_buffer` items of the `calls_due` rule.

  With `diff = inserts * spi - samples`: sampling needs `min_size` inserts
  and leaves diff >= spi * min_size - error_buffer; inserting (after the
  minimum) keeps diff <= spi * min_size + error_buffer.
  """

  def __init__(self, samples_per_insert: float, min_size: int, error_buffer: float):
    self.spi, self.min_size, self.error_buffer = samples_per_insert, min_size, error_buffer
    self.inserts, self.samples = 0, 0

  def _diff(self) -> float:
    return self.inserts * self.spi - self.samples

  def can_insert(self, count: int) -> bool:
    if self.inserts + count <= self.min_size:
      return True
    return self._diff() + count * self.spi <= self.spi * self.min_size + self.error_buffer

  def can_sample(self, count: int) -> bool:
    if self.inserts < self.min_size:
      return False
    return self._diff() - count >= self.spi * self.min_size - self.error_buffer
