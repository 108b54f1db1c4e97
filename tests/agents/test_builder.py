"""DQNBuilder: the components it makes for every run mode."""

import numpy as np
import pytest
from dm_env import specs as dm_specs

from acme_jax_dqn import specs, xla_setup

from agents.dqn import ConfigError, DQNBuilder, DQNConfig


def test_replay_too_small_for_the_limiter_is_a_config_error():
  builder = DQNBuilder(DQNConfig(replay_capacity=1000, min_replay_size=1000))
  with pytest.raises(ConfigError, match="`replay_capacity`=1000 is too small"):
    builder.make_rate_limiter(num_actors=2, insert_batch=64)


def test_learner_calls_follow_the_samples_per_insert_rule():
  builder = DQNBuilder(DQNConfig(batch_size=32, samples_per_insert=8.0, min_replay_size=100))
  assert [builder.learner_calls_due(n) for n in (99, 103, 104, 140)] == [0, 0, 1, 10]


def test_distributed_actors_take_their_ape_x_epsilons_from_the_builder():
  import jax  # pylint: disable=import-outside-toplevel
  from acme_jax_dqn import actors, envs, specs  # pylint: disable=import-outside-toplevel
  config = DQNConfig(hidden_sizes=(8,), apex_epsilons=True)
  builder = DQNBuilder(config)
  spec = specs.make_environment_spec(envs.make_environment("gymnasium:CartPole-v1", seed=0))
  networks = builder.make_networks(spec)
  made = [builder.make_actor(networks, None, jax.random.PRNGKey(0), actor_index=i,
                             num_actors=4).epsilon for i in range(4)]
  assert made == pytest.approx(list(actors.apex_epsilons(4, config.apex_epsilon_base,
                                                         config.apex_epsilon_alpha)))


def _cartpole_spec():
  """CartPole's specs, spelled out so that byte counts can be worked by hand."""
  return specs.EnvironmentSpec(
      observations=dm_specs.Array((4,), np.float32, "observation"),
      actions=dm_specs.DiscreteArray(2, name="action"),
      rewards=dm_specs.Array((), np.float32, "reward"),
      discounts=dm_specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"))


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_replay_the_device_cannot_hold_is_refused_naming_the_largest_capacity_that_fits(
    monkeypatch, prioritized):
  """CartPole's transition is 44 bytes (two observations of 4 float32, an int32 action, a
  float32 reward and discount); with 1 MiB of device memory 100,000 of them cannot fit. The
  capacity the error names fits and one more does not, with or without the sum tree."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 2**20)
  spec = _cartpole_spec()
  builder = lambda capacity: DQNBuilder(DQNConfig(replay_capacity=capacity, min_replay_size=100,
                                                  prioritized=prioritized))
  example = builder(100_000).example_transition(spec)
  assert xla_setup.nbytes(example) == 44
  with pytest.raises(ConfigError, match=r"`replay_capacity`=100000: the replay needs 0\.0 GiB "
                     r"\(44 bytes per transition\) and the (host|device) holds 0\.0 GiB\. Use "
                     r"`replay_capacity` <= (\d+)\.") as error:
    builder(100_000).make_replay_buffer(spec)
  suggested = int(str(error.value).rsplit("<= ", 1)[1].rstrip("."))
  if not prioritized:  # 44 bytes each, and the buffer's few counters.
    assert 0.9 * 2**20 / 44 - 2 <= suggested <= 0.9 * 2**20 / 44
  fitting = builder(suggested)
  fitting.check_replay_fits(fitting.make_replay(), example)
  with pytest.raises(ConfigError, match=f"`replay_capacity`={suggested + 1}: "):
    over = builder(suggested + 1)
    over.check_replay_fits(over.make_replay(), example)


@pytest.mark.parametrize("limit, named", [
    (2**10, "`batch_size` and `min_replay_size`"),  # About 20 transitions of 44 bytes fit.
    (3000, "`min_replay_size`"),  # About 60: the batch of 32 fits, the minimum of 100 not.
])
def test_a_replay_below_what_the_config_asks_it_to_hold_names_those_flags(
    monkeypatch, limit, named):
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: limit)
  builder = DQNBuilder(DQNConfig(replay_capacity=1000, min_replay_size=100, batch_size=32))
  with pytest.raises(ConfigError, match=rf"Use `replay_capacity` <= \d\d, and {named} no "
                     r"larger\.$"):
    builder.make_replay_buffer(_cartpole_spec())


def test_a_suggested_pqn_rollout_length_keeps_the_minibatches_whole(monkeypatch):
  """3 copies and 4 minibatches: only multiples of 4 steps split into 4 (3 x len % 4 == 0)."""
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: 2**20)
  builder = DQNBuilder(DQNConfig(pqn=True, layer_norm=True, num_envs=3, pqn_rollout_len=4000,
                                 pqn_minibatches=4))
  with pytest.raises(ConfigError, match=r"Use `pqn_rollout_len` <= (\d+), or fewer") as error:
    builder.make_replay_buffer(_cartpole_spec())
  suggested = int(str(error.value).rsplit("<= ", 1)[1].split(",")[0])
  assert 0 < suggested < 4000 and suggested % 4 == 0
  DQNBuilder(DQNConfig(pqn=True, layer_norm=True, num_envs=3, pqn_rollout_len=suggested,
                       pqn_minibatches=4)).make_replay_buffer(_cartpole_spec())


@pytest.mark.parametrize("limit_in_params, refused", [(5.5, True), (6.5, False)])
def test_the_learner_counts_six_times_its_parameters(monkeypatch, limit_in_params, refused):
  """A 2000-2000 MLP on CartPole: 4 x 2000 + 2000 + 2000 x 2000 + 2000 + 2000 x 2 + 2 float32
  parameters; online, target, Adam's two moments, a gradient and an update make six copies."""
  params = 4 * (4 * 2000 + 2000 + 2000 * 2000 + 2000 + 2000 * 2 + 2)
  monkeypatch.setattr(xla_setup, "device_memory_bytes",
                      lambda device: int(limit_in_params * params / 0.9))
  builder = DQNBuilder(DQNConfig(hidden_sizes=(2000, 2000)))
  networks = builder.make_networks(_cartpole_spec())
  if not refused:
    builder.check_learner_fits(networks)
    return
  with pytest.raises(ConfigError, match=r"the largest mlp_torso/mlp/~/linear_1/w of shape "
                     r"\(2000, 2000\)\)"):
    builder.check_learner_fits(networks)


def test_the_learner_is_counted_beside_a_replay_on_the_same_device(monkeypatch):
  params = 4 * (4 * 2000 + 2000 + 2000 * 2000 + 2000 + 2000 * 2 + 2)
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: int(6.5 * params / 0.9))
  builder = DQNBuilder(DQNConfig(hidden_sizes=(2000, 2000)))
  networks = builder.make_networks(_cartpole_spec())
  builder.check_learner_fits(networks, replay_bytes=params // 4)  # 6.25x: fits.
  with pytest.raises(ConfigError, match=r"\(2000, 2000\)\) beside the replay's 15.3 MiB, and the "
                     r"host holds .* or a smaller `replay_capacity`\.$"):
    builder.check_learner_fits(networks, replay_bytes=params)  # 7x.


def test_a_local_rays_other_nodes_are_counted_beside_the_learner(monkeypatch):
  """The learner: state 4P (online, target, Adam's two moments) plus 2P. Its other nodes: the
  driver's two snapshots of the state (8P), the variable server and the evaluator (2P), and P
  per actor. A limit of 20P holds the learner, the replay (P) and 3 actors, not 4."""
  params = 4 * (4 * 2000 + 2000 + 2000 * 2000 + 2000 + 2000 * 2 + 2)
  monkeypatch.setattr(xla_setup, "host_memory_bytes", lambda: int(20.5 * params / 0.9))
  builder = DQNBuilder(DQNConfig(hidden_sizes=(2000, 2000)))
  networks = builder.make_networks(_cartpole_spec())
  builder.check_learner_fits(networks, on_host=True, replay_bytes=params, num_actors=3)
  with pytest.raises(ConfigError, match=r"\(2000, 2000\)\) beside the replay's 15.3 MiB and the "
                     r"other nodes' 214.5 MiB \(.* each of 4 actors\), and the host holds .* or a "
                     r"smaller `replay_capacity`, or `num_actors` <= 3\.$"):
    builder.check_learner_fits(networks, on_host=True, replay_bytes=params, num_actors=4)
