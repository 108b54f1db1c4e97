"""Samples per insert (acme_jax_dqn/rate_limiting.py): one rule for the local loop, the anakin iteration and the distributed limiter."""

import pytest

from acme_jax_dqn import rate_limiting


def test_calls_due_by_hand():
  # min_size 100, 4 samples per insert, 16 samples per call: one call per 4 inserts after 100.
  due = lambda inserted: rate_limiting.calls_due(inserted, 100, 4.0, 16)
  assert [due(n) for n in (0, 99, 100, 103, 104, 107, 108, 140)] == [0, 0, 0, 0, 1, 1, 2, 10]


@pytest.mark.parametrize("per_call, spi, num_envs, shape", [
    (32, 8.0, 1, (4, 1)),     # DQN: a batch of 32 every 4 steps.
    (32, 8.0, 3, (4, 3)),     # 3 copies: 12 inserts are worth 3 calls.
    (128, 128.0, 1, (1, 1)),
    (32, 64.0, 1, (1, 2)),    # Two calls per env step.
    (32, 8.0, 10, (2, 5)),
])
def test_iteration_shape_is_the_smallest_whole_iteration_of_the_local_rule(per_call, spi,
                                                                           num_envs, shape):
  env_steps, calls = rate_limiting.iteration_shape(per_call, spi, num_envs)
  assert (env_steps, calls) == shape
  # The local rule, env step by env step, makes exactly `calls` calls per iteration.
  for k in range(1, 20):
    inserted = k * env_steps * num_envs
    assert rate_limiting.calls_due(inserted, 0, spi, per_call) == k * calls
  assert rate_limiting.kept_samples_per_insert(per_call, num_envs, *shape) == pytest.approx(spi)
  assert rate_limiting.ratio_warning(per_call, 1, spi, num_envs) is None


def test_a_ratio_no_short_iteration_keeps_is_rounded_and_warned_with_the_fields_that_fix_it():
  """Batch 32, ratio 8.2, 3 copies: exact only over 160 env steps, so one step, one call."""
  assert rate_limiting.iteration_shape(32, 8.2, 3) == (1, 1)
  message = rate_limiting.ratio_warning(32, 1, 8.2, 3)
  assert "10.67" in message and "`samples_per_insert`=8.2" in message
  # 5 copies make 32 env steps worth 41 calls: exact.
  for fix in ("`num_envs`=5", "`samples_per_insert`=10.6667"):
    assert fix in message
  assert rate_limiting.ratio_warning(32, 1, 8.2, 4) is None  # 2.4% off: within 5%.


def test_sample_to_insert_ratio_waits_for_min_size_then_keeps_the_ratio():
  limiter = rate_limiting.SampleToInsertRatio(samples_per_insert=4.0, min_size=100,
                                              error_buffer=64.0)
  assert not limiter.can_sample(16)
  assert limiter.can_insert(100)
  limiter.inserts = 100
  # Greedy simulation: insert 8 when allowed, sample 16 when allowed, for a while.
  worst = 0.0
  for _ in range(5000):
    if limiter.can_sample(16):
      limiter.samples += 16
    elif limiter.can_insert(8):
      limiter.inserts += 8
    else:
      raise AssertionError("deadlock: neither insert nor sample is allowed")
    worst = max(worst, abs((limiter.inserts - 100) * 4.0 - limiter.samples))
  assert worst <= 64.0 + 8 * 4.0  # Within the error buffer (plus one insert).
  assert limiter.samples / (limiter.inserts - 100) == pytest.approx(4.0, rel=0.02)


def test_error_buffer_leaves_room_for_every_actor_batch():
  buffer = rate_limiting.error_buffer(samples_per_call=32, samples_per_insert=8.0,
                                      num_actors=4, insert_batch=64)
  assert buffer >= 8.0 * 64 * 4 and buffer >= 2 * 32
