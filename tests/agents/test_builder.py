"""DQNBuilder: the components it makes for every run mode."""

import pytest

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
