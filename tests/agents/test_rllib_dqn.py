"""RLlib's DQN with the kit's JAX module and learner: Q-values, loss, learning, checkpoints, errors."""

import os
import signal

import gymnasium as gym
import jax
import numpy as np
import pytest
import ray
import rlax
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from acme_jax_dqn import losses
from acme_jax_dqn.types import Transition
from agents.dqn import ConfigError
from agents.rllib_dqn import JaxDQNConfig, JaxDQNModule, kit_config

CARTPOLE = gym.make("CartPole-v1")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
  """A private Ray for this module; the signal handlers and environment it changes come back."""
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  environ = dict(os.environ)
  ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
  yield
  ray.shutdown()
  for s, handler in handlers.items():
    signal.signal(s, handler)
  os.environ.clear()
  os.environ.update(environ)


def _module(**model_config):
  return RLModuleSpec(module_class=JaxDQNModule, observation_space=CARTPOLE.observation_space,
                      action_space=CARTPOLE.action_space,
                      model_config={"fcnet_hiddens": [8, 8], **model_config}).build()


def _relu_mlp(params, x, names):
  for i, name in enumerate(names):
    x = x @ np.asarray(params[name]["w"]) + np.asarray(params[name]["b"])
    if i < len(names) - 1:
      x = np.maximum(x, 0.0)
  return x


def test_module_q_values_are_the_networks_forward_pass_in_numpy():
  module = _module(double_q=False, dueling=False)
  obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
  names = sorted(module.params)  # mlp_torso/.../linear_0, linear_1, q_head/linear
  assert len(names) == 3
  want = _relu_mlp(module.params, obs, names)
  got = module.compute_q_values({"obs": obs})["qf_preds"]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(module.forward_inference({"obs": obs})["actions"],
                                want.argmax(axis=-1))


def test_dueling_and_c51_modules_follow_their_definitions():
  obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
  dueling = _module(dueling=True)
  q = dueling.compute_q_values({"obs": obs})["qf_preds"]
  assert q.shape == (3, 2)
  c51 = _module(num_atoms=11, v_min=-5.0, v_max=5.0)
  out = c51.compute_q_values({"obs": obs})
  assert out["qf_logits"].shape == (3, 2, 11)
  np.testing.assert_allclose(out["atoms"], np.linspace(-5, 5, 11), atol=1e-6)
  np.testing.assert_allclose(out["qf_preds"], np.sum(out["qf_probs"] * out["atoms"], -1),
                             rtol=1e-5, atol=1e-5)


def test_the_module_refuses_a_continuous_action_space():
  with pytest.raises(ConfigError, match=r"^action space Box.*needs a Discrete action space"):
    RLModuleSpec(module_class=JaxDQNModule,
                 observation_space=gym.make("Pendulum-v1").observation_space,
                 action_space=gym.make("Pendulum-v1").action_space, model_config={}).build()


def _config(**training):
  return (JaxDQNConfig().environment("CartPole-v1")
          .env_runners(num_env_runners=0)
          .reporting(min_sample_timesteps_per_iteration=500)
          .training(**{"lr": 1e-3, "train_batch_size_per_learner": 32, "n_step": 3,
                       "target_network_update_freq": 500,
                       "num_steps_sampled_before_learning_starts": 500,
                       "epsilon": [(0, 1.0), (3000, 0.05)], **training})
          .rl_module(model_config={"fcnet_hiddens": [64, 64]})
          .debugging(seed=0))


def _batch(rng, count=16):
  return {"obs": rng.normal(size=(count, 4)).astype(np.float32),
          "new_obs": rng.normal(size=(count, 4)).astype(np.float32),
          "actions": rng.integers(0, 2, size=count),
          "rewards": rng.normal(size=count),
          "terminateds": rng.random(count) < 0.3,
          "truncateds": np.zeros(count, bool),
          "n_step": rng.integers(1, 4, size=count),
          "weights": rng.random(count)}


@pytest.mark.parametrize("loss_fn", ["huber", "mse"])
def test_the_learners_loss_is_the_kits_loss_object_and_rlax_on_one_batch(loss_fn):
  algo = _config(td_error_loss_fn=loss_fn, double_q=True).build_algo()
  try:
    learner = algo.learner_group._learner  # pylint: disable=protected-access
    module = learner.module["default_policy"].unwrapped()
    module.target_params = jax.tree.map(lambda x: x * 0.9, module.params)  # Differ from online.
    batch = _batch(np.random.default_rng(2))
    config = learner.config.get_config_for_module("default_policy")
    got = learner.compute_loss_for_module(module_id="default_policy", config=config,
                                          batch=batch)
    gamma = config.gamma
    transitions = Transition(batch["obs"], batch["actions"].astype(np.int32),
                             batch["rewards"].astype(np.float32),
                             (gamma ** batch["n_step"] * (1 - batch["terminateds"])).astype(
                                 np.float32), batch["new_obs"])
    weights = batch["weights"].astype(np.float32)
    loss_object = losses.QLearningLoss(double_q=True,
                                       huber_delta=1.0 if loss_fn == "huber" else 0.0)
    want, _ = loss_object(module.networks.apply, module.params, module.target_params,
                          transitions, weights)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # And by rlax directly, outside the kit's loss object.
    q = module.compute_q_values({"obs": batch["obs"]})["qf_preds"]
    q_next_online = module.compute_q_values({"obs": batch["new_obs"]})["qf_preds"]
    q_next_target = module.forward_target({"obs": batch["new_obs"]})["qf_preds"]
    td = jax.vmap(rlax.double_q_learning)(q, transitions.action, transitions.reward,
                                          transitions.discount, q_next_target, q_next_online)
    per_example = rlax.huber_loss(td, 1.0) if loss_fn == "huber" else 0.5 * td ** 2
    np.testing.assert_allclose(got, np.mean(per_example * weights), rtol=1e-5)
  finally:
    algo.stop()


def _greedy_returns(module, episodes):
  env, returns = gym.make("CartPole-v1"), []
  for episode in range(episodes):
    observation, _ = env.reset(seed=episode)
    total, done = 0.0, False
    while not done:
      action = module.forward_inference({"obs": np.asarray(observation)[None]})["actions"][0]
      observation, reward, terminated, truncated, _ = env.step(int(action))
      total, done = total + reward, terminated or truncated
    returns.append(total)
  return returns


def test_rllib_dqn_with_the_jax_module_learns_cartpole_and_restores_exactly(tmp_path):
  algo = _config().build_algo()
  try:
    for _ in range(20):  # 10,000 env steps.
      result = algo.train()
    runners, learner_metrics = result["env_runners"], result["learners"]["default_policy"]
    assert runners["num_env_steps_sampled_lifetime"] >= 10_000
    greedy = _greedy_returns(algo.get_module(), episodes=5)
    assert np.mean(greedy) > 44.0  # Twice a random policy's return (about 22).
    for name in ("qf_loss", "td_error_mean", "q_mean", "q_max", "q_min"):
      assert np.isfinite(learner_metrics[name]), name
    assert learner_metrics["num_target_updates"] >= 10
    learner = algo.learner_group._learner  # pylint: disable=protected-access
    state = learner.get_state()
    algo.save(str(tmp_path))
  finally:
    algo.stop()
  restored = Algorithm.from_checkpoint(str(tmp_path))
  try:
    assert isinstance(restored.config, JaxDQNConfig)
    again = restored.learner_group._learner.get_state()  # pylint: disable=protected-access
    leaves, tree = jax.tree.flatten(state["rl_module"])
    leaves_again, tree_again = jax.tree.flatten(again["rl_module"])
    assert tree == tree_again
    for a, b in zip(leaves, leaves_again):  # Params, target params, key: bit for bit.
      np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(state["optimizer"]), jax.tree.leaves(again["optimizer"])):
      np.testing.assert_array_equal(a, b)
    restored.train()  # And it trains on.
  finally:
    restored.stop()


@pytest.mark.parametrize("change, option", [
    (lambda c: c.training(noisy=True), "noisy"),
    (lambda c: c.learners(num_learners=2), "num_learners"),
    (lambda c: c.training(lr=[[0, 1e-3], [1000, 1e-4]]), "lr"),
    (lambda c: c.training(grad_clip=10.0, grad_clip_by="value"), "grad_clip_by"),
    (lambda c: c.framework("tf2"), "framework"),
    (lambda c: c.rl_module(model_config={"use_lstm": True}), "use_lstm"),
])
def test_an_option_the_kit_cannot_honour_is_refused_naming_it(change, option):
  with pytest.raises(ConfigError, match=f"^`{option}`=") as raised:
    change(_config()).validate()
  assert "\n" not in str(raised.value)


def test_an_unknown_rllib_option_is_named():
  with pytest.raises(TypeError, match="unexpected keyword argument 'double_qq'"):
    _config(double_qq=True)


def test_kit_config_maps_rllib_options():
  kit = kit_config({"double_q": True, "dueling": False, "num_atoms": 51, "v_min": 0,
                    "v_max": 100, "fcnet_hiddens": [32], "hiddens": [16],
                    "fcnet_use_layernorm": True},
                   _config(td_error_loss_fn="mse", gamma=0.95, lr=2e-4))
  assert (kit.double_q, kit.dueling, kit.distributional, kit.num_atoms) == (True, False, True, 51)
  assert (kit.v_min, kit.v_max, kit.hidden_sizes, kit.layer_norm) == (0.0, 100.0, (32, 16), True)
  assert (kit.huber_delta, kit.discount, kit.learning_rate) == (0.0, 0.95, 2e-4)


def test_rllibs_env_runner_asks_torch_for_a_device_which_the_jax_runner_avoids():
  """The library gap JaxEnvRunner works around: RLlib 2.60's `get_device` knows torch only."""
  from ray.rllib.utils.framework import get_device  # pylint: disable=import-outside-toplevel
  with pytest.raises(NotImplementedError):
    get_device(_config())
