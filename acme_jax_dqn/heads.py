"""Q-network heads and their layers: Q, dueling, C51, quantile (QR-DQN) and implicit-quantile (IQN) heads; NoisyLinear."""

from typing import NamedTuple, Optional

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np


class NetworkOutput(NamedTuple):
  """What every head returns: Q-values, plus logits and atoms for C51, quantiles for QR-DQN."""
  q_values: chex.Array  # [B, A]
  logits: Optional[chex.Array] = None  # [B, A, N] for distributional heads.
  atoms: Optional[chex.Array] = None  # [N] support of the return distribution.
  quantiles: Optional[chex.Array] = None  # [B, A, N] return quantiles (QR-DQN, IQN).
  taus: Optional[chex.Array] = None  # [N] (QR-DQN) or [B, N] (IQN) fractions of `quantiles`.


class NoisyLinear(hk.Module):
  """A linear layer with factorised Gaussian noise (Fortunato et al. 2018, "Noisy Networks").

  w = mu_w + sigma_w * f(eps_in) f(eps_out)^T and b = mu_b + sigma_b * f(eps_out),
  f(x) = sign(x) sqrt(|x|), eps ~ N(0, 1) drawn from `hk.next_rng_key()`
  when `noise` is on; off, the layer uses the mean weights. mu starts
  uniform in +-1/sqrt(fan_in), sigma at sigma0/sqrt(fan_in).
  """

  def __init__(self, output_size: int, sigma0: float = 0.5, name: Optional[str] = None):
    super().__init__(name=name)
    self._output_size, self._sigma0 = output_size, sigma0

  def __call__(self, x: chex.Array, noise: bool) -> chex.Array:
    fan_in = x.shape[-1]
    bound = 1.0 / np.sqrt(fan_in)
    mu_init = hk.initializers.RandomUniform(-bound, bound)
    sigma_init = hk.initializers.Constant(self._sigma0 * bound)
    shape = (fan_in, self._output_size)
    mu_w = hk.get_parameter("mu_w", shape, x.dtype, init=mu_init)
    mu_b = hk.get_parameter("mu_b", (self._output_size,), x.dtype, init=mu_init)
    sigma_w = hk.get_parameter("sigma_w", shape, x.dtype, init=sigma_init)
    sigma_b = hk.get_parameter("sigma_b", (self._output_size,), x.dtype, init=sigma_init)
    if not noise:
      return x @ mu_w + mu_b
    in_key, out_key = jax.random.split(hk.next_rng_key())
    scale = lambda e: jnp.sign(e) * jnp.sqrt(jnp.abs(e))  # pylint: disable=unnecessary-lambda-assignment
    eps_in = scale(jax.random.normal(in_key, (fan_in,), x.dtype))
    eps_out = scale(jax.random.normal(out_key, (self._output_size,), x.dtype))
    return x @ (mu_w + sigma_w * jnp.outer(eps_in, eps_out)) + mu_b + sigma_b * eps_out


class Dense(NamedTuple):
  """How a network's linear layers are made: plain, or noisy with noise on or off."""
  noisy: bool = False
  noise: bool = False
  sigma0: float = 0.5

  def __call__(self, size: int, name: Optional[str] = None):
    if not self.noisy:
      return hk.Linear(size, name=name)
    return lambda x: NoisyLinear(size, self.sigma0, name=name)(x, self.noise)


class QHead(hk.Module):
  """A linear layer to one Q-value per action."""

  def __init__(self, num_actions: int, dense: Dense = Dense(), name: str = "q_head"):
    super().__init__(name=name)
    self._num_actions, self._dense = num_actions, dense

  def __call__(self, features: chex.Array) -> NetworkOutput:
    return NetworkOutput(q_values=self._dense(self._num_actions, name="linear")(features))


class DuelingHead(hk.Module):
  """Q = V + A - mean_a A (Wang et al. 2016, "Dueling Network Architectures")."""

  def __init__(self, num_actions: int, dense: Dense = Dense(), name: str = "dueling_head"):
    super().__init__(name=name)
    self._num_actions, self._dense = num_actions, dense

  def __call__(self, features: chex.Array) -> NetworkOutput:
    value = self._dense(1, name="value")(features)  # [B, 1]
    advantages = self._dense(self._num_actions, name="advantages")(features)  # [B, A]
    advantages -= jnp.mean(advantages, axis=-1, keepdims=True)
    return NetworkOutput(q_values=value + advantages)


def _per_action(dense: Dense, features: chex.Array, num_actions: int, size: int,
                dueling: bool) -> chex.Array:
  """`size` outputs per action [B, A, N]; dueling: V + A - mean_a A per output (as Rainbow)."""
  advantages = dense(num_actions * size, name="advantages")(features)
  out = advantages.reshape(features.shape[0], num_actions, size)  # [B, A, N]
  if dueling:
    value = dense(size, name="value")(features)[:, None, :]  # [B, 1, N]
    out = value + out - jnp.mean(out, axis=1, keepdims=True)
  return out


class CategoricalHead(hk.Module):
  """C51 logits over `num_atoms` atoms in [v_min, v_max] (Bellemare et al. 2017).

  With `dueling=True` the value and advantage streams are combined per atom,
  logits = V + A - mean_a A, as in Rainbow (Hessel et al. 2018).
  """

  def __init__(self, num_actions: int, num_atoms: int, v_min: float,
               v_max: float, dueling: bool = False, dense: Dense = Dense(),
               name: str = "c51_head"):
    super().__init__(name=name)
    self._dense = dense
    self._num_actions = num_actions
    self._num_atoms = num_atoms
    self._v_min = v_min
    self._v_max = v_max
    self._dueling = dueling

  def __call__(self, features: chex.Array) -> NetworkOutput:
    num_atoms = self._num_atoms
    logits = _per_action(self._dense, features, self._num_actions, num_atoms, self._dueling)
    atoms = jnp.linspace(self._v_min, self._v_max, num_atoms)  # [N]
    q_values = jnp.sum(jax.nn.softmax(logits, axis=-1) * atoms, axis=-1)  # [B, A]
    return NetworkOutput(q_values=q_values, logits=logits, atoms=atoms)


class QuantileHead(hk.Module):
  """`num_quantiles` return quantiles per action at fractions (2i + 1) / 2N (QR-DQN).

  Dabney et al. 2018a, "Distributional RL with Quantile Regression". With
  `dueling=True` value and advantage streams combine per quantile,
  quantiles = V + A - mean_a A. Q-values are the quantiles' mean.
  """

  def __init__(self, num_actions: int, num_quantiles: int, dueling: bool = False,
               dense: Dense = Dense(), name: str = "quantile_head"):
    super().__init__(name=name)
    self._num_actions, self._num_quantiles, self._dueling = num_actions, num_quantiles, dueling
    self._dense = dense

  def __call__(self, features: chex.Array) -> NetworkOutput:
    num_quantiles = self._num_quantiles
    quantiles = _per_action(self._dense, features, self._num_actions, num_quantiles,
                            self._dueling)
    taus = (jnp.arange(num_quantiles, dtype=jnp.float32) + 0.5) / num_quantiles  # [N]
    return NetworkOutput(q_values=jnp.mean(quantiles, axis=-1), quantiles=quantiles,
                         taus=taus)


class ImplicitQuantileHead(hk.Module):
  """IQN (Dabney et al. 2018b): quantiles at fractions tau, embedded by cosines into the features.

  phi(tau) = ReLU(Linear(cos(pi * i * tau), i = 0..num_cosines-1)) multiplies
  the torso's features elementwise; a Q head (dueling with `dueling`) maps
  each product to one quantile per action.
  """

  def __init__(self, num_actions: int, num_cosines: int = 64, dueling: bool = False,
               dense: Dense = Dense(), name: str = "iqn_head"):
    super().__init__(name=name)
    self._num_actions, self._num_cosines, self._dueling = num_actions, num_cosines, dueling
    self._dense = dense

  def __call__(self, features: chex.Array, taus: chex.Array) -> NetworkOutput:
    batch_size, width = features.shape
    num_taus = taus.shape[1]
    cosines = jnp.cos(jnp.pi * jnp.arange(self._num_cosines, dtype=jnp.float32)
                      * taus[..., None])  # [B, T, C]
    embedding = jax.nn.relu(hk.Linear(width, name="tau_embedding")(cosines))  # [B, T, D]
    x = (features[:, None, :] * embedding).reshape(batch_size * num_taus, width)
    head = (DuelingHead(self._num_actions, self._dense) if self._dueling
            else QHead(self._num_actions, self._dense))
    quantiles = head(x).q_values.reshape(batch_size, num_taus, self._num_actions)
    quantiles = jnp.swapaxes(quantiles, 1, 2)  # [B, A, T]
    return NetworkOutput(q_values=jnp.mean(quantiles, axis=-1), quantiles=quantiles,
                         taus=taus)
