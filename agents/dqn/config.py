"""DQN-family configuration: one frozen dataclass whose fields choose the variant."""

import dataclasses
import math
from typing import Tuple

from acme_jax_dqn.choices import (CONV_IMPLS, FUSED_LOSS_MAX_WIDTH, FUSED_LOSS_TAKES, LR_SCHEDULES,
                                  TORSOS)


@dataclasses.dataclass(frozen=True)
class DQNConfig:
  """Hyperparameters of the DQN family; each field is also the flag `--<name>`.

  Attributes:
    discount: per-step discount gamma of the return.
    n_step: steps summed before bootstrapping (1 is one-step TD).
    double_q: pick the bootstrap action with the online network (Double DQN).
    dueling: dueling head, Q = V + A - mean A (Wang et al. 2016).
    distributional: C51 head and loss (Bellemare et al. 2017).
    num_atoms: atoms of the C51 return distribution (51 in the paper).
    v_min: lowest atom of the C51 support.
    v_max: highest atom of the C51 support.
    quantile: QR-DQN quantile head and quantile Huber loss (Dabney et al. 2018a); double_q and dueling compose with it.
    num_quantiles: quantiles per action of the QR-DQN head (200 in the paper).
    quantile_huber_kappa: kappa of the quantile Huber loss (1 in the paper; rlax's Huber, without the paper's division by kappa); 0 is the plain quantile loss.
    munchausen: Munchausen DQN's target (Vieillard et al. 2020): a scaled, clipped log-policy bonus and a soft (entropy-regularised) bootstrap; with iqn it is M-IQN.
    munchausen_alpha: scale of the log-policy bonus (0.9 in the paper).
    munchausen_tau: entropy temperature of the softmax policy (0.03 in the paper).
    munchausen_clip: l0, the lower clip of the scaled log-policy tau * log pi in the bonus (-1 in the paper).
    layer_norm: a LayerNorm before each hidden ReLU of the torso's MLP (any variant but fused_loss).
    iqn: IQN (Dabney et al. 2018b): quantiles at sampled fractions, embedded by cosines; the quantile Huber loss (quantile_huber_kappa) over N x N' sampled fractions, the greedy action from K; double_q and dueling compose with it.
    iqn_num_cosines: cosines of the fraction embedding (64 in the paper).
    iqn_num_taus: N, the online network's sampled fractions per example (64 in the paper).
    iqn_num_target_taus: N', the target network's fractions per example (64 in the paper).
    iqn_num_policy_taus: K, the fractions behind the Q-values that pick actions (32 in the paper).
    noisy: factorised Gaussian noisy layers in the head (Fortunato et al. 2018): fresh noise per learner step (online and target apart) and per acting step, mean weights at evaluation. On the command line it sets epsilon_start and epsilon_end to 0 unless they are given beside it (a flagfile's epsilons give way to --noisy written on the command line).
    noisy_torso: noisy layers in the torso's MLP too (with noisy).
    noisy_sigma0: sigma0 of the noisy layers' initial noise scale, sigma0 / sqrt(fan_in) (0.5 in the paper).
    pqn: PQN (Gallici et al. 2024): no target network and no replay; each update collects num_envs x pqn_rollout_len steps, computes Q(lambda) returns (terminations and truncations kept apart) and runs pqn_epochs epochs of pqn_minibatches minibatches. Anakin and local modes; use it with layer_norm.
    pqn_lambda: lambda of PQN's Q(lambda) returns (0.65 in the paper's MinAtar and Atari runs; 0 is one-step Q-learning).
    pqn_rollout_len: env steps of every env copy in one PQN rollout.
    pqn_epochs: passes over each rollout.
    pqn_minibatches: minibatches per pass; num_envs x pqn_rollout_len must divide evenly by it.
    hidden_sizes: MLP layer sizes (after the convolutions for image torsos).
    torso: "auto" (MLP for vectors, Nature conv for images, MinAtar conv for images under 36x36), "mlp", "nature_conv" or "minatar_conv".
    conv_impl: how the conv torsos convolve: "patches" (the image's k x k patches times a matrix, plain matrix products), "lax_conv" (jax.lax.conv_general_dilated; cuDNN on NVIDIA GPUs) or "auto" (patches for the MinAtar torso on the CPU, where they run faster, lax_conv otherwise). Either gives the same parameters and function.
    huber_delta: Huber threshold of the Q-value losses (DQN, double Q, Munchausen DQN, PQN, fused_loss; C51, QR-DQN and IQN use quantile_huber_kappa); 0 uses the squared loss 0.5 * td**2, PQN's (its presets set 0).
    fused_loss: the TD loss and its gradient in one Pallas kernel per seed, with the batch and every activation kept in the kernel (acme_jax_dqn/fused_loss.py): for GPUs (Triton); elsewhere Pallas interprets it, slower than the default. Q-learning or double Q-learning of a plain MLP torso (no layer_norm, noisy or munchausen) with a linear Q head only, at most 128 inputs, units per layer and actions.
    reward_clip: clip each env reward to [-c, c] before the n-step sum, as DQN and Rainbow on Atari (0: off; episode returns stay unclipped).
    learning_rate: Adam step size (initial value when a schedule is set).
    learning_rate_schedule: "constant", "linear" or "cosine" decay over learning_rate_decay_steps applied updates.
    learning_rate_end: learning rate reached at the end of the decay.
    learning_rate_decay_steps: applied updates of the decay (0 keeps it constant); with gradient accumulation an update is k SGD steps.
    adam_eps: Adam's epsilon (Dopamine uses 1.5e-4 for Atari DQN).
    max_grad_norm: clip gradients to this global norm; 0 turns clipping off.
    gradient_accumulation_steps: average gradients over k SGD steps before applying (optax.MultiSteps); the lr schedule, target updates and PER beta count applied updates.
    num_sgd_steps_per_step: SGD steps in one learner call (one jitted scan).
    batch_size: transitions per SGD step (not PQN's: its minibatch is num_envs x pqn_rollout_len / pqn_minibatches).
    replay_capacity: transitions the replay holds; the oldest are overwritten.
    min_replay_size: transitions in replay before learning starts.
    samples_per_insert: sampled transitions per inserted one (e.g. batch 32 every 4 steps = 8).
    prioritized: prioritized replay (Schaul et al. 2016) with importance weights.
    priority_exponent: alpha, how strongly priorities shape sampling.
    importance_sampling_exponent: beta at the start of learning.
    importance_sampling_exponent_end: beta reached after the annealing.
    importance_sampling_anneal_steps: applied updates to anneal beta over (0 keeps it constant); with gradient accumulation an update is k SGD steps.
    priority_epsilon: added to new priorities so no sampled transition gets priority 0 (a non-finite TD error gets 0, so it is not drawn again).
    target_update_period: applied updates between target updates (SGD steps, or k-step groups under gradient accumulation).
    target_update_tau: each target update moves tau of the way to the online params (1 copies them).
    epsilon_start: exploration epsilon at the first env step.
    epsilon_end: exploration epsilon after the decay.
    epsilon_decay_steps: env steps of the linear epsilon decay, counted over the run (all env copies; all actor nodes together in distributed mode).
    eval_epsilon: epsilon of the evaluation policy (0 is greedy).
    apex_epsilons: one fixed epsilon per env copy of the run (N = num_envs, times num_actors in distributed mode), base ** (1 + alpha * i / (N - 1)) (Horgan et al. 2018), instead of the linear schedule.
    apex_epsilon_base: base of the Ape-X epsilons (0.4 in the paper).
    apex_epsilon_alpha: alpha of the Ape-X epsilons (7 in the paper).
    variable_update_period: local and distributed modes: actor calls (one per batch of env copies) between parameter pulls; anakin acts on the newest parameters.
    num_envs: environment copies stepped together by one actor.
  """
  discount: float = 0.99
  n_step: int = 1
  double_q: bool = False
  dueling: bool = False
  distributional: bool = False
  num_atoms: int = 51
  v_min: float = -10.0
  v_max: float = 10.0
  quantile: bool = False
  num_quantiles: int = 200
  quantile_huber_kappa: float = 1.0
  munchausen: bool = False
  munchausen_alpha: float = 0.9
  munchausen_tau: float = 0.03
  munchausen_clip: float = -1.0
  layer_norm: bool = False
  iqn: bool = False
  iqn_num_cosines: int = 64
  iqn_num_taus: int = 64
  iqn_num_target_taus: int = 64
  iqn_num_policy_taus: int = 32
  noisy: bool = False
  noisy_torso: bool = False
  noisy_sigma0: float = 0.5
  pqn: bool = False
  pqn_lambda: float = 0.65
  pqn_rollout_len: int = 32
  pqn_epochs: int = 2
  pqn_minibatches: int = 32
  hidden_sizes: Tuple[int, ...] = (256, 256)
  torso: str = "auto"
  conv_impl: str = "auto"
  huber_delta: float = 1.0
  fused_loss: bool = False
  reward_clip: float = 0.0
  learning_rate: float = 1e-3
  learning_rate_schedule: str = "constant"
  learning_rate_end: float = 0.0
  learning_rate_decay_steps: int = 0
  adam_eps: float = 1e-8
  max_grad_norm: float = 10.0
  gradient_accumulation_steps: int = 1
  num_sgd_steps_per_step: int = 1
  batch_size: int = 32
  replay_capacity: int = 100_000
  min_replay_size: int = 1_000
  samples_per_insert: float = 8.0
  prioritized: bool = False
  priority_exponent: float = 0.6
  importance_sampling_exponent: float = 0.4
  importance_sampling_exponent_end: float = 1.0
  importance_sampling_anneal_steps: int = 0
  priority_epsilon: float = 1e-6
  target_update_period: int = 100
  target_update_tau: float = 1.0
  epsilon_start: float = 1.0
  epsilon_end: float = 0.05
  epsilon_decay_steps: int = 10_000
  eval_epsilon: float = 0.0
  apex_epsilons: bool = False
  apex_epsilon_base: float = 0.4
  apex_epsilon_alpha: float = 7.0
  variable_update_period: int = 1
  num_envs: int = 1

  def __post_init__(self):
    object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in self.hidden_sizes))
    _check(self)

  @property
  def sgd_steps_per_learner_step(self) -> int:
    """SGD steps in one learner call (PQN: one call per rollout, epochs x minibatches)."""
    if self.pqn:
      return self.pqn_epochs * self.pqn_minibatches
    return self.num_sgd_steps_per_step

  @property
  def samples_per_learner_step(self) -> int:
    """Transitions sampled by one learner call (all its SGD steps)."""
    return self.batch_size * self.num_sgd_steps_per_step

  @property
  def inserts_per_learner_step(self) -> int:
    """Inserted transitions per learner call that keep `samples_per_insert`."""
    return max(1, round(self.samples_per_learner_step / self.samples_per_insert))


def field_docs(config_class=None) -> dict:
  """Each field's reason, read from a config dataclass's `Attributes:` docstring.

  A field's text runs on over the lines indented below its name. The flags
  of `launch/` take their help from here.
  """
  config_class = config_class or DQNConfig
  names = {f.name for f in dataclasses.fields(config_class)}
  docs, current, indent = {}, None, None
  for line in (config_class.__doc__ or "").splitlines():
    text = line.strip()
    depth = len(line) - len(line.lstrip())
    name, sep, first = text.partition(": ")
    if sep and name in names and (indent is None or depth <= indent):
      current, indent = name, depth
      docs[name] = first
    elif current is not None and text and depth > indent:
      docs[current] += " " + text
    else:
      current = None
  return docs


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field (flag) and the fix."""


INT32_MAX = 2**31 - 1


def fail(field: str, value, why: str) -> None:
  """Raises ConfigError naming `field`=value (in the kit's terms) and why it cannot work."""
  raise ConfigError(f"`{field}`={value!r}: {why}")


# The fix a memory check names when the learner's network is what does not fit.
SMALLER_NETWORK = ("a smaller network (`hidden_sizes`, `torso`, `iqn_num_cosines`) or fewer "
                   "outputs per action (`num_atoms`, `num_quantiles`)")


def check_int32(field: str, value: int, what: str = "it") -> None:
  """Refuses a `value` above INT32_MAX: the compiled programs hold `what` as a 32-bit integer."""
  if value > INT32_MAX:
    fail(field, value, f"must be at most {INT32_MAX:,} (2**31 - 1): the compiled programs "
         f"hold {what} as a 32-bit integer.")


def _check(c: DQNConfig) -> None:
  """Single-field ranges first, then fields that must agree with each other."""
  for field in dataclasses.fields(c):
    value = getattr(c, field.name)
    if isinstance(value, float) and not math.isfinite(value):
      fail(field.name, value, "must be a finite number.")
  at_least_one = ("n_step", "batch_size", "replay_capacity", "min_replay_size",
                  "target_update_period", "num_envs", "num_sgd_steps_per_step",
                  "gradient_accumulation_steps", "variable_update_period", "num_quantiles",
                  "iqn_num_cosines", "iqn_num_taus", "iqn_num_target_taus",
                  "iqn_num_policy_taus", "pqn_rollout_len", "pqn_epochs", "pqn_minibatches")
  for name in at_least_one:
    value = getattr(c, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      fail(name, value, "must be an integer of at least 1.")
    check_int32(name, value)  # Sizes and counts inside compiled programs are int32.
  for name in ("epsilon_decay_steps", "learning_rate_decay_steps",
               "importance_sampling_anneal_steps"):
    if getattr(c, name) < 0:
      fail(name, getattr(c, name), "must be 0 (off) or a positive number of steps.")
  for name in ("epsilon_start", "epsilon_end", "eval_epsilon", "apex_epsilon_base",
               "importance_sampling_exponent", "importance_sampling_exponent_end"):
    if not 0.0 <= getattr(c, name) <= 1.0:
      fail(name, getattr(c, name), "must lie in [0, 1].")
  if not 0.0 < c.discount <= 1.0:
    fail("discount", c.discount, "must lie in (0, 1]; 0.99 is usual.")
  if not c.learning_rate > 0:
    fail("learning_rate", c.learning_rate, "must be positive (e.g. 1e-3).")
  if c.learning_rate_end < 0:
    fail("learning_rate_end", c.learning_rate_end, "must be 0 or positive.")
  if c.learning_rate_schedule not in LR_SCHEDULES:
    fail("learning_rate_schedule", c.learning_rate_schedule, f"must be one of {LR_SCHEDULES}.")
  if not c.adam_eps > 0:
    fail("adam_eps", c.adam_eps, "must be positive.")
  if c.max_grad_norm < 0:
    fail("max_grad_norm", c.max_grad_norm, "must be positive, or 0 to turn clipping off.")
  if c.reward_clip < 0:
    fail("reward_clip", c.reward_clip, "must be positive (1 clips to [-1, 1]), or 0 to "
          "turn clipping off.")
  if c.huber_delta < 0:
    fail("huber_delta", c.huber_delta, "must be positive, or 0 for the squared loss.")
  if not c.samples_per_insert > 0:
    fail("samples_per_insert", c.samples_per_insert,
          "must be positive (e.g. 8 = batch 32 every 4 env steps).")
  if not 0.0 < c.target_update_tau <= 1.0:
    fail("target_update_tau", c.target_update_tau,
          "must lie in (0, 1]: 1 copies the online params every "
          "`target_update_period` steps, a small value (0.005) with "
          "`target_update_period`=1 is Polyak averaging.")
  if not 0.0 <= c.priority_exponent <= 1.0:
    fail("priority_exponent", c.priority_exponent, "must lie in [0, 1] (0.6 is usual).")
  if c.apex_epsilon_alpha < 0:
    fail("apex_epsilon_alpha", c.apex_epsilon_alpha, "must be 0 or positive (7 in Ape-X).")
  if not c.priority_epsilon > 0:
    fail("priority_epsilon", c.priority_epsilon, "must be positive.")
  if c.torso not in TORSOS:
    fail("torso", c.torso, f"must be one of {TORSOS}.")
  if c.conv_impl not in CONV_IMPLS:
    fail("conv_impl", c.conv_impl, f"must be one of {CONV_IMPLS}.")
  if not c.hidden_sizes or any(h < 1 for h in c.hidden_sizes):
    fail("hidden_sizes", ",".join(map(str, c.hidden_sizes)),
          "must be a comma-separated list of positive layer sizes, e.g. 256,256.")
  if not c.v_min < c.v_max:
    fail("v_min", c.v_min, f"must be below `v_max`={c.v_max}: the C51 support "
          "runs from v_min up to v_max.")
  if c.distributional and c.num_atoms < 2:
    fail("num_atoms", c.num_atoms, "C51 (`distributional`) needs at least 2 atoms "
          "(51 in the paper); use `distributional`=False for a plain Q head.")
  if c.quantile_huber_kappa < 0:
    fail("quantile_huber_kappa", c.quantile_huber_kappa, "must be 0 (the plain quantile "
         "loss) or positive (1 in the paper).")
  if not 0.0 <= c.munchausen_alpha <= 1.0:
    fail("munchausen_alpha", c.munchausen_alpha, "must lie in [0, 1] (0.9 in the paper).")
  if not c.munchausen_tau > 0:
    fail("munchausen_tau", c.munchausen_tau, "must be positive (0.03 in the paper).")
  if not c.munchausen_clip < 0:
    fail("munchausen_clip", c.munchausen_clip, "must be negative (-1 in the paper): the "
         "log-policy bonus is clipped to [munchausen_clip, 0].")
  if not c.noisy_sigma0 > 0:
    fail("noisy_sigma0", c.noisy_sigma0, "must be positive (0.5 in the paper).")
  if c.noisy and c.apex_epsilons:
    fail("apex_epsilons", True, "noisy networks (`noisy`) explore by their noise; Ape-X's "
         "fixed epsilons would add epsilon-greedy exploration on top. Drop one.")
  if c.noisy_torso and not c.noisy:
    fail("noisy_torso", True, "puts noisy layers in the torso as well as the head: it "
         "needs `noisy`=True.")
  heads = [name for name in ("distributional", "quantile", "iqn") if getattr(c, name)]
  if len(heads) > 1:
    fail(heads[1], True, f"`{heads[0]}` and `{heads[1]}` are two distributional heads: "
         "set one of `distributional` (C51), `quantile` (QR-DQN) and `iqn`.")
  if c.munchausen and (c.distributional or c.quantile or c.double_q):
    other = next(name for name in ("distributional", "quantile", "double_q")
                 if getattr(c, name))
    fail("munchausen", True, f"Munchausen DQN's soft target has its own bootstrap (no greedy "
         f"action), built for Q-values and IQN (M-IQN), so it does not combine with "
         f"`{other}`; drop one.")
  if c.fused_loss:
    _check_fused_loss(c)
  if not 0.0 <= c.pqn_lambda <= 1.0:
    fail("pqn_lambda", c.pqn_lambda, "must lie in [0, 1] (0.65 in the paper).")
  if c.pqn:
    _check_pqn(c)
  if c.min_replay_size > c.replay_capacity:
    fail("min_replay_size", c.min_replay_size,
          f"is above `replay_capacity`={c.replay_capacity}, so learning would "
          "never start. Lower `min_replay_size` or raise `replay_capacity`.")
  if c.inserts_per_learner_step > c.replay_capacity:
    fail("samples_per_insert", c.samples_per_insert,
          f"means {c.inserts_per_learner_step} inserts per learner step, more than "
          f"`replay_capacity`={c.replay_capacity}. Raise `samples_per_insert` or the capacity.")
  if c.batch_size > c.replay_capacity:
    fail("batch_size", c.batch_size,
          f"is above `replay_capacity`={c.replay_capacity}; raise the capacity.")
  if not c.pqn and c.num_envs > c.replay_capacity:
    fail("num_envs", c.num_envs,
         f"copies insert {c.num_envs} transitions every env step, more than "
         f"`replay_capacity`={c.replay_capacity} holds. Raise `replay_capacity` or lower "
         "`num_envs`.")


# What PQN cannot take: each needs replay, a target network or a bootstrap it has not.
_NOT_WITH_PQN = {
    "prioritized": "PQN learns from each rollout once, in order: there is no replay to prioritize",
    "double_q": "double Q picks the bootstrap action online and evaluates it on a target "
                "network, and PQN has none",
    "distributional": "PQN regresses Q-values on Q(lambda) returns; C51 is not built for it",
    "quantile": "PQN regresses Q-values on Q(lambda) returns; QR-DQN is not built for it",
    "iqn": "PQN regresses Q-values on Q(lambda) returns; IQN is not built for it",
    "munchausen": "PQN's Q(lambda) return has no soft bootstrap",
    "noisy": "PQN explores by its epsilon schedule; noisy layers are not built for it",
}


# What the fused loss's kernel does not compute: it holds Q-learning of a plain MLP Q-network.
_NOT_WITH_FUSED_LOSS = ("pqn", "distributional", "quantile", "iqn", "munchausen", "dueling",
                        "noisy", "layer_norm")


def _check_fused_loss(c: DQNConfig) -> None:
  for name in _NOT_WITH_FUSED_LOSS:
    if getattr(c, name):
      fail("fused_loss", True, f"its kernel computes {FUSED_LOSS_TAKES}, not `{name}`. "
           f"Drop `fused_loss` or `{name}`.")
  if c.torso not in ("auto", "mlp"):
    fail("fused_loss", True, f"its kernel computes {FUSED_LOSS_TAKES}, not `torso`="
         f"{c.torso}. Drop `fused_loss` or use `torso`=mlp.")
  if max(c.hidden_sizes) > FUSED_LOSS_MAX_WIDTH:
    fail("fused_loss", True, f"its kernel holds layers of at most {FUSED_LOSS_MAX_WIDTH} "
         f"units, and `hidden_sizes`={','.join(map(str, c.hidden_sizes))} has "
         f"{max(c.hidden_sizes)}. Use `hidden_sizes` of at most {FUSED_LOSS_MAX_WIDTH} each, "
         "or drop `fused_loss`.")


def _check_pqn(c: DQNConfig) -> None:
  for name, why in _NOT_WITH_PQN.items():
    if getattr(c, name):
      fail(name, True, f"{why}. Drop `{name}` or `pqn`.")
  if c.n_step != 1:
    fail("n_step", c.n_step, "PQN's Q(lambda) return already mixes multi-step returns "
         "(`pqn_lambda`); set `n_step`=1.")
  steps = c.num_envs * c.pqn_rollout_len
  if steps % c.pqn_minibatches:
    fail("pqn_minibatches", c.pqn_minibatches,
         f"must divide a rollout's `num_envs` x `pqn_rollout_len` = {steps} steps evenly; "
         "pick a divisor, or change `num_envs` or `pqn_rollout_len`.")
