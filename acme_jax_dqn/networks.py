"""Haiku Q-networks: MLP, Nature-DQN and MinAtar conv torsos, the heads of acme_jax_dqn/heads.py, `make_networks`."""

import functools
from typing import Callable, NamedTuple, Optional, Sequence

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from acme_jax_dqn import specs as specs_lib
from acme_jax_dqn import xla_setup
from acme_jax_dqn.choices import CONV_IMPLS, TORSOS
from acme_jax_dqn.heads import (CategoricalHead, Dense, DuelingHead, ImplicitQuantileHead,
                                NetworkOutput, QHead, QuantileHead)
from acme_jax_dqn.types import Params

# Images smaller than this get the small MinAtar torso under `torso`=auto.
MIN_NATURE_CONV_SIZE = 36


class Networks(NamedTuple):
  """A pure Q-network: `init(key) -> params`, `apply(params, obs[B, ...], noise_key=None)`.

  `apply` returns a NetworkOutput. A `stochastic` network draws from
  `noise_key`: noisy layers their noise (None: the mean weights, for
  evaluation), IQN its quantile fractions (None: evenly spaced ones).
  IQN's `apply` also takes `num_taus`. Other networks ignore the key.
  """
  init: Callable[[chex.PRNGKey], Params]
  apply: Callable[..., NetworkOutput]
  num_actions: int
  distributional: bool
  stochastic: bool = False


def hidden_layers(x: chex.Array, hidden_sizes: Sequence[int], layer_norm: bool,
                  dense: Dense = Dense()) -> chex.Array:
  """Linear layers with ReLUs; with `layer_norm`, a LayerNorm before each ReLU (as PQN)."""
  if not layer_norm and not dense.noisy:
    return hk.nets.MLP(tuple(hidden_sizes), activate_final=True)(x)
  for i, size in enumerate(hidden_sizes):
    x = dense(size, name=f"linear_{i}")(x)
    if layer_norm:
      x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True,
                       name=f"layer_norm_{i}")(x)
    x = jax.nn.relu(x)
  return x


class MLPTorso(hk.Module):
  """Flattens a vector observation and applies an MLP with ReLUs."""

  def __init__(self, hidden_sizes: Sequence[int], layer_norm: bool = False,
               dense: Dense = Dense(), name: str = "mlp_torso"):
    super().__init__(name=name)
    self._hidden_sizes, self._layer_norm, self._dense = tuple(hidden_sizes), layer_norm, dense

  def __call__(self, observation: chex.Array) -> chex.Array:
    x = hk.Flatten()(observation.astype(jnp.float32))
    return hidden_layers(x, self._hidden_sizes, self._layer_norm, self._dense)


class NatureConvTorso(hk.Module):
  """The conv torso of Mnih et al. 2015 (Nature DQN), then an MLP (512 in the paper)."""

  def __init__(self, hidden_sizes: Sequence[int], layer_norm: bool = False,
               dense: Dense = Dense(), name: str = "nature_conv_torso", conv_impl: str = "auto"):
    super().__init__(name=name)
    self._hidden_sizes, self._layer_norm, self._dense = tuple(hidden_sizes), layer_norm, dense
    self._patches = conv_impl == "patches"  # auto: lax.conv, as patches measured no faster
    # on the CPU (bench/conv_speed.py).

  def __call__(self, observation: chex.Array) -> chex.Array:
    x = observation.astype(jnp.float32)
    if observation.dtype == jnp.uint8:
      x = x / 255.0  # Pixels arrive as uint8; scale once here, not in replay.
    for channels, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
      conv = (PatchConv2D(channels, size, stride, use_patches=True) if self._patches
              else hk.Conv2D(channels, kernel_shape=size, stride=stride, padding="VALID"))
      x = jax.nn.relu(conv(x))
    return hidden_layers(hk.Flatten()(x), self._hidden_sizes, self._layer_norm, self._dense)


class PatchConv2D(hk.Module):
  """A VALID convolution that XLA's CPU backend runs fast: image patches times a matrix.

  The same function, parameters (`w` [k, k, C, F], `b` [F]), names and
  initialiser as `hk.Conv2D(F, k, stride, padding="VALID")`, so
  checkpoints of either load in the other. With patches (by default on the
  CPU) it gathers the k*k strided slices of the input and multiplies them
  by `w`; otherwise (by default on GPUs and TPUs) it calls
  `lax.conv_general_dilated`. `use_patches` picks either. The MinAtar torso uses it: in
  the compiled anakin program on MinAtar Breakout the run is 1.5x faster
  than with `lax.conv` on this CPU (`python bench/conv_speed.py`, end to
  end), though a gradient timed alone is not faster (same bench), so the
  gain comes from how XLA compiles the whole program; the Nature torso
  keeps `hk.Conv2D` (unless `conv_impl`=patches), where patches measured
  no faster.
  tests/test_networks.py checks both paths against hk.Conv2D.
  """

  def __init__(self, output_channels: int, kernel_size: int, stride: int = 1,
               use_patches: Optional[bool] = None, name: str = "conv2_d"):
    super().__init__(name=name)
    self._channels, self._k, self._stride = output_channels, kernel_size, stride
    self._use_patches = use_patches  # None: patches on the CPU backend only.

  def __call__(self, x: chex.Array) -> chex.Array:
    k, s, (height, width, channels) = self._k, self._stride, x.shape[-3:]
    fan_in = k * k * channels
    w_init = hk.initializers.TruncatedNormal(1.0 / np.sqrt(fan_in))  # hk.Conv2D's default.
    w = hk.get_parameter("w", (k, k, channels, self._channels), x.dtype, init=w_init)
    b = hk.get_parameter("b", (self._channels,), x.dtype, init=jnp.zeros)
    use_patches = (xla_setup.target_platform() == "cpu" if self._use_patches is None
                   else self._use_patches)
    if not use_patches:
      out = jax.lax.conv_general_dilated(x, w, (s, s), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
      return out + b
    out_h, out_w = (height - k) // s + 1, (width - k) // s + 1
    # Patch order (row i, column j, channel) matches w's [k, k, C] layout.
    patches = jnp.concatenate(
        [x[..., i:i + s * (out_h - 1) + 1:s, j:j + s * (out_w - 1) + 1:s, :]
         for i in range(k) for j in range(k)], axis=-1)
    return patches @ w.reshape(fan_in, self._channels) + b


class MinAtarConvTorso(hk.Module):
  """The torso of Young & Tian 2019 (MinAtar): one 3x3 conv of 16 filters, stride 1, then an MLP (128)."""

  def __init__(self, hidden_sizes: Sequence[int], layer_norm: bool = False,
               dense: Dense = Dense(), name: str = "minatar_conv_torso", conv_impl: str = "auto"):
    super().__init__(name=name)
    self._hidden_sizes, self._layer_norm, self._dense = tuple(hidden_sizes), layer_norm, dense
    self._patches = None if conv_impl == "auto" else conv_impl == "patches"

  def __call__(self, observation: chex.Array) -> chex.Array:
    x = observation.astype(jnp.float32)
    x = jax.nn.relu(PatchConv2D(16, kernel_size=3, use_patches=self._patches)(x))
    return hidden_layers(hk.Flatten()(x), self._hidden_sizes, self._layer_norm, self._dense)


def choose_torso(observation_shape: Sequence[int], torso: str) -> str:
  """Resolves `torso` (one of TORSOS) for an observation shape."""
  rank = len(observation_shape)
  if torso not in TORSOS:
    raise ValueError(f"Unknown torso {torso!r}; `torso` must be one of {TORSOS}.")
  if torso == "auto":
    if rank == 1:
      return "mlp"
    if rank == 3:
      small = min(observation_shape[:2]) < MIN_NATURE_CONV_SIZE
      return "minatar_conv" if small else "nature_conv"
    raise ValueError(
        f"Observations of shape {tuple(observation_shape)} (rank {rank}) fit "
        "neither torso: the MLP takes vectors [D] and the conv torso images "
        "[H, W, C]. Wrap the environment to give one of those shapes.")
  if torso == "mlp" and rank != 1:
    conv = "nature_conv"
    if rank == 3 and min(observation_shape[:2]) < MIN_NATURE_CONV_SIZE:
      conv = "minatar_conv"
    raise ValueError(
        f"`torso`=mlp takes vector observations [D], but this environment's "
        f"observations have shape {tuple(observation_shape)}. Use "
        f"`torso`={conv} (or `torso`=auto) for these images, or flatten them with "
        "a wrapper (gymnasium.wrappers.FlattenObservation).")
  if torso == "minatar_conv" and rank != 3:
    raise ValueError(
        f"`torso`=minatar_conv takes image observations [H, W, C], but this "
        f"environment's observations have shape {tuple(observation_shape)}. "
        "Use `torso`=mlp (or `torso`=auto).")
  if torso == "nature_conv":
    if rank != 3:
      raise ValueError(
          f"`torso`=nature_conv takes image observations [H, W, C], but this "
          f"environment's observations have shape {tuple(observation_shape)}. "
          "Use `torso`=mlp (or `torso`=auto).")
    height, width = observation_shape[:2]
    if min(height, width) < MIN_NATURE_CONV_SIZE:
      raise ValueError(
          f"`torso`=nature_conv needs images of at least 36x36 pixels; these "
          f"are {height}x{width}. Resize them (84x84 as in Nature DQN), or use "
          "`torso`=minatar_conv (or auto) for small images such as MinAtar's.")
  return torso


def make_networks(
    spec: specs_lib.EnvironmentSpec,
    *,
    hidden_sizes: Sequence[int] = (512,),
    dueling: bool = False,
    distributional: bool = False,
    num_atoms: int = 51,
    v_min: float = -10.0,
    v_max: float = 10.0,
    torso: str = "auto",
    quantile: bool = False,
    num_quantiles: int = 200,
    layer_norm: bool = False,
    noisy: bool = False,
    noisy_torso: bool = False,
    noisy_sigma0: float = 0.5,
    iqn: bool = False,
    iqn_num_cosines: int = 64,
    iqn_num_policy_taus: int = 32,
    env_name: str = "",
    conv_impl: str = "auto",
) -> Networks:
  """Builds the Q-network for an environment spec.

  Args:
    spec: the environment's spec; its actions must be discrete.
    hidden_sizes: MLP layer sizes (after the convolutions for the conv torso).
    dueling: use a dueling head (value and advantage streams).
    distributional: use a C51 head with `num_atoms` atoms in [v_min, v_max].
    num_atoms: number of atoms of the C51 support.
    v_min: lowest atom.
    v_max: highest atom.
    torso: "auto" (MLP for vectors, Nature conv for images of 36x36 or more,
      MinAtar conv for smaller ones), "mlp", "nature_conv" or "minatar_conv".
    quantile: use a QR-DQN head with `num_quantiles` quantiles per action.
    num_quantiles: quantiles per action of the QR-DQN head.
    layer_norm: a LayerNorm before each hidden ReLU of the torso's MLP.
    noisy: factorised Gaussian noisy layers (`NoisyLinear`) in the head.
    noisy_torso: noisy layers in the torso's MLP too (with `noisy`).
    noisy_sigma0: sigma0 of the noisy layers (0.5 in the paper).
    iqn: use an IQN head; `apply(params, obs, key, num_taus)` samples
      `num_taus` fractions from `key` (default `iqn_num_policy_taus`; with
      no key, that many evenly spaced ones).
    iqn_num_cosines: cosines of IQN's fraction embedding (64 in the paper).
    iqn_num_policy_taus: fractions behind IQN's Q-values by default (K, 32).
    env_name: used in error messages only.
    conv_impl: how the conv torsos convolve (one of CONV_IMPLS): "patches"
      (k x k image patches times a matrix), "lax_conv"
      (`lax.conv_general_dilated`, cuDNN on NVIDIA GPUs) or "auto" (patches
      for the MinAtar torso on the CPU, lax.conv otherwise). The MLP torso
      ignores it.

  Returns:
    Pure `Networks` whose `init` binds a dummy observation internally.
  """
  num_actions = specs_lib.check_discrete_actions(spec, env_name)
  observation_shape = tuple(spec.observations.shape)
  torso_name = choose_torso(observation_shape, torso)
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"Unknown conv_impl {conv_impl!r}; `conv_impl` must be one of {CONV_IMPLS}.")
  torso_cls = {"mlp": MLPTorso, "nature_conv": NatureConvTorso,
               "minatar_conv": MinAtarConvTorso}[torso_name]
  if torso_name != "mlp":
    torso_cls = functools.partial(torso_cls, conv_impl=conv_impl)

  def forward(observation: chex.Array, noise: bool = False,
              taus: Optional[chex.Array] = None) -> NetworkOutput:
    head_dense = Dense(noisy=noisy, noise=noise, sigma0=noisy_sigma0)
    torso_dense = head_dense if noisy_torso else Dense()
    features = torso_cls(hidden_sizes, layer_norm, torso_dense)(observation)
    if iqn:
      return ImplicitQuantileHead(num_actions, iqn_num_cosines, dueling=dueling,
                                  dense=head_dense)(features, taus)
    if quantile:
      return QuantileHead(num_actions, num_quantiles, dueling=dueling, dense=head_dense)(features)
    if distributional:
      return CategoricalHead(num_actions, num_atoms, v_min, v_max,
                             dueling=dueling, dense=head_dense)(features)
    if dueling:
      return DuelingHead(num_actions, head_dense)(features)
    return QHead(num_actions, head_dense)(features)

  transformed = hk.transform(forward)
  dummy_observation = np.zeros((1, *observation_shape),
                               dtype=spec.observations.dtype)

  def init(key: chex.PRNGKey) -> Params:
    taus = jnp.full((1, 1), 0.5) if iqn else None
    return transformed.init(key, dummy_observation, False, taus)

  def apply(params: Params, observation: chex.Array,
            noise_key: Optional[chex.PRNGKey] = None,
            num_taus: Optional[int] = None) -> NetworkOutput:
    taus = None
    if iqn:
      count = num_taus or iqn_num_policy_taus
      if noise_key is None:  # Evenly spaced fractions: a deterministic policy.
        taus = jnp.broadcast_to((jnp.arange(count) + 0.5) / count,
                                (observation.shape[0], count))
      else:  # Per count, so different counts drawn with one key are not the same draws.
        noise_key, tau_key = jax.random.split(jax.random.fold_in(noise_key, count))
        taus = jax.random.uniform(tau_key, (observation.shape[0], count))
    if noisy and noise_key is not None:
      return transformed.apply(params, noise_key, observation, True, taus)
    return transformed.apply(params, None, observation, False, taus)

  return Networks(init=init, apply=apply, num_actions=num_actions,
                  distributional=distributional, stochastic=noisy or iqn)
