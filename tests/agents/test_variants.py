"""The newer family members run end to end in local and anakin mode (distributed: tests/integration).

PQN, which has no distributed mode, is refused there before anything is built.
"""

import math

import jax
import numpy as np
import pytest

from acme_jax_dqn import envs
from agents.dqn import ConfigError, DQNConfig
from agents.dqn.builder import DQNBuilder
from agents.dqn.experiment import ExperimentConfig, run_experiment

TINY = dict(hidden_sizes=(16,), batch_size=16, min_replay_size=200, replay_capacity=1000,
            samples_per_insert=8.0, epsilon_decay_steps=300)
VARIANTS = {
    "iqn_dueling_noisy": dict(iqn=True, iqn_num_cosines=8, iqn_num_taus=8,
                              iqn_num_target_taus=8, iqn_num_policy_taus=4, dueling=True,
                              double_q=True, noisy=True),
    "qr_layer_norm": dict(quantile=True, num_quantiles=8, layer_norm=True, n_step=3),
    "munchausen_prioritized": dict(munchausen=True, prioritized=True),
    "m_iqn": dict(munchausen=True, iqn=True, iqn_num_cosines=8, iqn_num_taus=8,
                  iqn_num_target_taus=8, iqn_num_policy_taus=4),
    "pqn_dueling": dict(pqn=True, layer_norm=True, dueling=True, num_envs=4,
                        pqn_rollout_len=16, pqn_minibatches=4, pqn_epochs=2),
    "fused_loss_double_prioritized": dict(fused_loss=True, double_q=True, prioritized=True,
                                          n_step=3),
}


@pytest.mark.parametrize("mode", ["local", "anakin"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variant_trains_and_evaluates(mode, variant, tmp_path):
  env = "gymnax:CartPole-v1" if mode == "anakin" else "gymnasium:CartPole-v1"
  summary = run_experiment(
      ExperimentConfig(env=env, run_mode=mode, total_steps=600, logdir=str(tmp_path),
                       eval_episodes=2, quiet=True, loggers=("csv",),
                       compilation_cache_dir="", save_checkpoints=False),
      DQNConfig(**TINY, **VARIANTS[variant]))
  assert summary["learner_steps"] > 0 and math.isfinite(summary["eval_return_mean"])
  assert summary["nonfinite_updates"] == 0
  for field, value in VARIANTS[variant].items():
    assert summary["config"][field] == value


def test_pqn_learns_from_every_rollout_once(tmp_path):
  """Local PQN: one update of epochs x minibatches SGD steps per complete rollout of 4 x 16 steps."""
  summary = run_experiment(
      ExperimentConfig(env="gymnasium:CartPole-v1", total_steps=640, logdir=str(tmp_path),
                       eval_episodes=1, quiet=True, loggers=("csv",),
                       compilation_cache_dir="", save_checkpoints=False),
      DQNConfig(**TINY, **VARIANTS["pqn_dueling"]))
  rollouts = summary["env_steps"] // (4 * 16)
  assert summary["learner_steps"] == rollouts * 2 * 4


def test_pqn_is_refused_in_distributed_mode(tmp_path):
  with pytest.raises(ConfigError, match="`pqn`=True with `run_mode`=distributed"):
    run_experiment(ExperimentConfig(env="gymnasium:CartPole-v1", run_mode="distributed",
                                    total_steps=600, logdir=str(tmp_path), quiet=True,
                                    compilation_cache_dir=""),
                   DQNConfig(**TINY, pqn=True))


def test_a_pqn_chunk_row_holds_the_means_and_sums_of_its_iterations():
  """A chunk of two iterations trains what two chunks of one train; its learner metrics are
  the mean of theirs, its episode counts and returns their sum."""
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(DQNConfig(**TINY, **VARIANTS["pqn_dueling"]))
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=1)
  state = jax.jit(trainer.init)(jax.random.PRNGKey(3))
  one = jax.jit(lambda s, i: trainer.train_chunk(s, i, 1))
  two_state, two = jax.jit(lambda s, i: trainer.train_chunk(s, i, 2))(state, 0)
  state_a, a = one(state, 0)
  state_b, b = one(state_a, 1)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
               two_state.learner.online_params, state_b.learner.online_params)
  assert float(b["episodes"]) > 0  # 2 x 64 CartPole steps end an episode or more.
  for name in ("episode_return_sum", "episodes"):
    np.testing.assert_allclose(two[name], a[name] + b[name], rtol=1e-6)
  for name in ("loss", "q_mean", "td_error_abs_mean"):
    np.testing.assert_allclose(two[name], (a[name] + b[name]) / 2, rtol=1e-5)
  assert int(two["env_steps"]) == int(b["env_steps"]) == 2 * 4 * 16
  unrolled_state, unrolled = jax.jit(lambda s, i: trainer.train_chunk(s, i, 2, unroll=2))(
      state, 0)  # Both iterations in one loop step: the same computation.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8),
               two_state.learner.online_params, unrolled_state.learner.online_params)
  for name in two:
    np.testing.assert_allclose(np.asarray(two[name], np.float64),
                               np.asarray(unrolled[name], np.float64), rtol=1e-6)


@pytest.mark.parametrize("overrides", [dict(huber_delta=0.0), dict(double_q=True, prioritized=True,
                                                                   max_grad_norm=1.0)])
def test_the_fused_loss_learns_as_the_xla_loss_does_step_by_step(overrides):
  """From the same state and replay, a few anakin learn steps with the fused loss (interpreted
  here) give the parameters, metrics and priorities of the rlax loss through autodiff."""
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  results = []
  for fused in (False, True):
    config = DQNConfig(**{**TINY, "min_replay_size": 500, "num_envs": 4,
                          "target_update_period": 2, **overrides, "fused_loss": fused})
    builder = DQNBuilder(config)
    trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=1)
    state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
    # 400 real transitions in replay, none learned from (learning would start at 500).
    state, _ = jax.jit(trainer.train_chunk, static_argnums=2)(state, 0, 100)
    assert int(state.learner.steps) == 0
    learn = jax.jit(trainer.learn)
    rows = []
    for _ in range(5):
      state, metrics = learn(state)
      rows.append(jax.device_get(metrics))
    results.append((jax.device_get(state), rows))
  (plain, plain_rows), (fused, fused_rows) = results
  assert int(fused.learner.steps) == int(plain.learner.steps) >= 5
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               fused.learner.online_params, plain.learner.online_params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               fused.learner.target_params, plain.learner.target_params)
  for plain_row, fused_row in zip(plain_rows, fused_rows):
    assert set(plain_row) == set(fused_row)
    for name in plain_row:
      np.testing.assert_allclose(fused_row[name], plain_row[name], rtol=1e-4, atol=1e-6,
                                 err_msg=name)
  if overrides.get("prioritized"):  # flashbax's sum tree holds the priorities written back.
    written = [np.asarray(state.buffer.sum_tree_state.nodes) for state in (plain, fused)]
    assert len(np.unique(written[0])) > 10
    np.testing.assert_allclose(written[1], written[0], rtol=1e-4)
