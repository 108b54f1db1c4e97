"""`JaxDQNConfig`: RLlib's `DQNConfig` whose module and learner are the kit's JAX ones.

  from agents.rllib_dqn import JaxDQNConfig
  config = (JaxDQNConfig().environment("CartPole-v1")
            .training(double_q=True, dueling=True, n_step=3, num_atoms=51, v_min=0, v_max=100,
                      td_error_loss_fn="huber", tau=1.0, target_network_update_freq=500))
  algo = config.build_algo()
  algo.train()

Everything else (env runners, replay buffers, n-step sampling, the
training loop, checkpoints) is RLlib's. An RLlib option the kit cannot
honour is refused by `validate()` in one line that names it.
"""

from ray.rllib.algorithms.dqn import DQNConfig as RLlibDQNConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from agents.dqn.config import ConfigError
from agents.rllib_dqn.learner import JaxDQNLearner, JaxEnvRunner
from agents.rllib_dqn.module import JaxDQNModule


class JaxDQNConfig(RLlibDQNConfig):
  """RLlib's DQN options, mapped onto the kit's (agents/rllib_dqn/catalog.py, `kit_config`)."""

  def __init__(self, algo_class=None):
    super().__init__(algo_class=algo_class)
    self.framework_str = "jax"
    self.env_runner_cls = JaxEnvRunner

  def get_default_rl_module_spec(self) -> RLModuleSpec:
    return RLModuleSpec(module_class=JaxDQNModule, model_config=self.model_config)

  def get_default_learner_class(self):
    return JaxDQNLearner

  def validate(self) -> None:
    refused = {
        "framework": (self.framework_str != "jax",
                      "the module and learner are JAX; keep framework('jax')"),
        "noisy": (self.noisy, "RLlib's noisy layers are not built into the JAX module; "
                              "use epsilon exploration (`epsilon`)"),
        "num_learners": (self.num_learners > 0, "RLlib 2.60 starts remote learners only "
                                                "for torch; use num_learners=0 (the local "
                                                "learner) and scale with env runners"),
        "lr": (not isinstance(self.lr, (int, float)),
               "a learning-rate schedule is not read by the kit's optimizer; pass a number"),
        "grad_clip_by": (self.grad_clip is not None and self.grad_clip_by != "global_norm",
                         "the kit's optimizer clips by global norm only"),
        "burn_in_len": (self.burn_in_len > 0, "the JAX module has no recurrent state"),
        "categorical_distribution_temperature": (
            self.categorical_distribution_temperature != 1.0,
            "the JAX module acts epsilon-greedily on Q-values; it has no temperature"),
        "fcnet_activation": (self.model_config.get("fcnet_activation", "relu") != "relu",
                             "the kit's MLP torso uses ReLU"),
        "use_lstm": (bool(self.model_config.get("use_lstm")),
                     "the JAX module has no recurrent state"),
        "conv_filters": (bool(self.model_config.get("conv_filters")),
                         "the JAX module's torso is an MLP over Box observations"),
    }
    for option, (bad, why) in refused.items():
      if bad:
        value = getattr(self, option, None)
        if option == "framework":
          value = self.framework_str
        elif option in ("fcnet_activation", "use_lstm", "conv_filters"):
          value = self.model_config.get(option)
        raise ConfigError(f"`{option}`={value!r}: {why}.")
    super().validate()
