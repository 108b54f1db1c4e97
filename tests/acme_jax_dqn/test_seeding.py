"""Seeds of a run's streams: derived from the run seed, distinct within a run and across runs."""

import jax
import numpy as np
import pytest

from acme_jax_dqn import envs
from acme_jax_dqn import seeding
from acme_jax_dqn import xla_setup
from acme_jax_dqn.seeding import Stream


def _run_stream_seeds(seed, num_envs=16, num_actors=256):
  """Every derived seed a run of each mode may use, with its stream's name."""
  streams = {("agent",): seed}  # The root: jax.random.PRNGKey(seed) in every mode.
  train = seeding.derive_seed(seed, Stream.TRAIN_ENVS)
  streams[("train envs",)] = train
  streams.update({("train env copy", i): s
                  for i, s in enumerate(seeding.copy_seeds(train, num_envs))})
  streams[("eval env",)] = seeding.derive_seed(seed, Stream.EVAL_ENV)
  streams[("anakin eval key",)] = seeding.derive_seed(seed, Stream.EVAL_KEYS)
  streams[("evaluator",)] = seeding.derive_seed(seed, Stream.EVALUATOR)
  streams[("replay",)] = seeding.derive_seed(seed, Stream.REPLAY)
  for actor in range(num_actors):
    envs_seed = seeding.derive_seed(seed, Stream.ACTOR_ENVS, actor)
    streams[("actor envs", actor)] = envs_seed
    streams[("actor key", actor)] = seeding.derive_seed(seed, Stream.ACTOR, actor)
    streams.update({("actor env copy", actor, i): s
                    for i, s in enumerate(seeding.copy_seeds(envs_seed, num_envs))})
  return streams


def test_no_two_streams_of_a_run_share_a_seed():
  for seed in (0, 1, 12345):
    streams = _run_stream_seeds(seed)
    values = list(streams.values())
    assert len(set(values)) == len(values)
    # Actor 99's environments and the evaluator's were both seed + 1,000,000 before.
    assert streams[("actor env copy", 99, 0)] != streams[("eval env",)]


def test_neighbouring_run_seeds_share_no_stream():
  runs = [set(_run_stream_seeds(seed, num_envs=8, num_actors=8).values()) - {seed}
          for seed in range(6)]
  for i, a in enumerate(runs):
    for b in runs[i + 1:]:
      assert not a & b


def test_derived_seeds_are_fixed_31_bit_values():
  assert seeding.derive_seed(7, Stream.EVAL_ENV) == seeding.derive_seed(7, Stream.EVAL_ENV)
  assert all(0 <= seeding.derive_seed(2 ** 40, 3, i) < 2 ** 31 for i in range(200))
  assert np.asarray(seeding.derive_key(7, Stream.REPLAY)).shape == (2,)


def test_env_copies_start_apart_and_apart_from_the_next_seeds_copies():
  """Seed 0's copy 1 was seed 1's copy 0 under seed + index; now every copy differs."""
  first = {}
  for seed in (0, 1):
    environment = envs.make_environment("gymnasium:CartPole-v1", seed=seed, num_envs=4)
    first[seed] = np.asarray(environment.reset().observation)
    assert len({tuple(row) for row in first[seed]}) == 4
  assert not any(np.allclose(a, b) for a in first[0] for b in first[1])
  one = envs.make_environment("gymnasium:CartPole-v1", seed=0)  # Unbatched: the seed as given.
  np.testing.assert_array_equal(one.reset().observation,
                                envs.make_environment("gymnasium:CartPole-v1",
                                                      seed=0).reset().observation)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_keys_of_many_seeds_in_one_call_are_each_seeds_prngkey(impl):
  """Many seeds take one compiled call; each key is `jax.random.PRNGKey` of its seed, under
  every key implementation, also at the ends of int32; a seed past int32 goes one by one."""
  seeds = [0, 1, 2**31 - 1] + list(range(1000, 1100))
  with xla_setup.prng_impl(impl):
    expected = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
    np.testing.assert_array_equal(seeding.keys_of(seeds), expected)
    wide = seeds + [2**33 + 5]
    last = np.asarray(jax.random.PRNGKey(wide[-1]))[None]
    np.testing.assert_array_equal(seeding.keys_of(wide), np.concatenate([expected, last]))


def test_key_shape_is_the_shape_of_a_key_of_the_implementation_in_force():
  for impl, words in (("threefry2x32", 2), ("rbg", 4), ("unsafe_rbg", 4), ("threefry2x32", 2)):
    with xla_setup.prng_impl(impl):
      shape = seeding.key_shape()
      assert (shape.shape, shape.dtype) == ((words,), np.uint32)
      assert shape.shape == jax.random.PRNGKey(0).shape


def test_on_host_runs_eager_work_on_the_cpu_device_and_stays_put_without_one(monkeypatch):
  with xla_setup.on_host():
    assert jax.numpy.ones(2).devices() == {jax.local_devices(backend="cpu")[0]}
  def no_cpu_backend(*args, backend=None, **kwargs):
    raise RuntimeError("Unknown backend cpu")  # As with JAX_PLATFORMS=cuda.
  monkeypatch.setattr(jax, "local_devices", no_cpu_backend)
  with xla_setup.on_host():
    assert float(jax.numpy.ones(2).sum()) == 2.0
