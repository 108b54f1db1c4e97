"""Q-learning's TD loss of an MLP Q-network, and its gradient, in one Pallas kernel.

`FusedQLearningLoss` computes what `losses.QLearningLoss` computes for the
plain Q-network (an MLP torso with ReLUs and a linear Q head): the online
network's Q-values, the target network's (and with `double_q` the online
network's) on the next observations, the TD errors, the weighted Huber or
squared loss, its metrics, and the loss's gradient with respect to the
online parameters, by backpropagation written out by hand. The batch, the
weights and every activation stay in the kernel, where the XLA path writes
each layer's activations and their gradients to the device's memory and
reads them back: for many seeds, most of a learning step's memory traffic.

On a GPU it is one Triton kernel per seed (`jax.vmap` gives each seed a
program of the grid); elsewhere Pallas interprets it, for tests. Triton's
array sizes are powers of two, so each dimension is padded in the kernel
(padded rows, units and actions masked to zero, or to -inf where actions
are maximised) and a dot's sides are at least 16; every read and write is
masked to its array (`_load`). The dots are Triton's, at its default
precision for float32 (TensorFloat-32 on GPUs that have it, as XLA's).

`jax.value_and_grad` of the loss takes the kernel's gradient
(`jax.custom_vjp`): the learner step (`learning.make_sgd_step`), the
optimiser, the non-finite guard and the target update are those of the XLA
path, which takes its gradient norm from the squares the kernel sums as it
writes the gradient (`LossExtras.grad_squared_norm`).
"""

import dataclasses
import functools
import math
import re
from typing import Any, List, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from acme_jax_dqn import networks
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup
from acme_jax_dqn.choices import FUSED_LOSS_MAX_WIDTH, FUSED_LOSS_TAKES
from acme_jax_dqn.losses import LossExtras, default_weights_and_mask
from acme_jax_dqn.types import Params, Transition

# Warps per seed's program, and the batch's rows per block: Triton tuning knobs (a 128 x 128
# float32 block takes 64 registers per thread with 8 warps; a thread has at most 255).
NUM_WARPS = 8
ROW_BLOCK = 128
# The kernel's scalar outputs, in this order (the last: `LossExtras.grad_squared_norm`).
STATS = ("loss", "td_error_mean", "td_error_abs_mean", "q_mean", "q_min", "q_max",
         "grad_squared_norm")
_TORSO_LAYER = re.compile(r"^mlp_torso/.*linear_(\d+)$")
_HEAD_LAYER = "q_head/linear"


def padded(size: int) -> int:
  """The kernel's size for a dimension: a power of two, at least 16 (a Triton dot's least)."""
  return max(16, 1 << (size - 1).bit_length())


def mlp_layer_names(params: Params) -> List[str]:
  """The plain Q-network's layers, input first; a ValueError for any other network."""
  torso = sorted(((int(m.group(1)), name) for name in params
                  for m in [_TORSO_LAYER.match(name)] if m))
  names = [name for _, name in torso] + [_HEAD_LAYER]
  if set(names) != set(params) or any(set(params[n]) != {"w", "b"} for n in names):
    raise ValueError("the fused loss takes an MLP torso with a linear Q head (no dueling, "
                     f"distributional, quantile, noisy or LayerNorm layers); got layers "
                     f"{sorted(params)}.")
  return names


def check_input(spec: specs.EnvironmentSpec, torso: str, hidden_sizes: Sequence[int],
                batch_size: int, double_q: bool, huber_delta: float, env_name: str = "") -> None:
  """A ValueError naming `fused_loss` for observations or actions the kernel cannot take, or
  (on a GPU) a network it cannot hold (`check_fits`)."""
  shape = tuple(spec.observations.shape)
  of_env = f" of {env_name}" if env_name else ""
  if networks.choose_torso(shape, torso) != "mlp":
    raise ValueError(
        f"`fused_loss`=True: its kernel computes {FUSED_LOSS_TAKES}, and observations of "
        f"shape {shape}{of_env} take a conv torso under `torso`={torso}. Drop `fused_loss`.")
  widths = {"observations": math.prod(shape),
            "actions": specs.check_discrete_actions(spec, env_name)}
  for what, width in widths.items():
    if width > FUSED_LOSS_MAX_WIDTH:
      raise ValueError(
          f"`fused_loss`=True: its kernel holds layers of at most {FUSED_LOSS_MAX_WIDTH} "
          f"units, and the {what}{of_env} have {width}. Drop `fused_loss`.")
  check_fits(widths["observations"], hidden_sizes, widths["actions"], batch_size, double_q,
             huber_delta)


def _iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _inside(shape, bounds):
  """True where a block's element lies within the array: below `bounds` on every axis."""
  inside = None
  for axis, bound in enumerate(bounds):
    if isinstance(bound, int) and bound >= shape[axis]:
      continue
    axis_inside = _iota(shape, axis) < bound
    inside = axis_inside if inside is None else inside & axis_inside
  return jnp.ones(shape, bool) if inside is None else inside


def _load(ref, bounds, index=None):
  """`ref[index]`, a padded block, with 0 past `bounds` (the array's extent on each axis):
  Triton reads a block at the array's strides, past its edges unless masked."""
  view = ref if index is None else ref.at[index]
  return pltriton.load(view, mask=_inside(view.shape, bounds), other=0)


def _store(ref, value, bounds, index=None):
  """Writes `value` to `ref[index]` within `bounds` (see `_load`)."""
  view = ref if index is None else ref.at[index]
  pltriton.store(view, value, mask=_inside(view.shape, bounds))


# Triton's float max and min drop a NaN (max(NaN, 0) is 0), where XLA's return it: a NaN
# observation or activation would then give a finite loss and gradient, which the learner's
# non-finite guard lets through. The kernel's maxima and minima are selects, or reductions
# of arrays whose NaNs are made infinities first, so a NaN still ends as a non-finite loss.
def _relu(x):
  return jnp.where(x < 0.0, 0.0, x)  # NaN < 0 is false: NaN stays.


def _larger(a, b):
  return jnp.where(a < b, b, a)  # A NaN in `a` stays (and the kernel's `b` has none).


def _smaller(a, b):
  return jnp.where(a > b, b, a)


def _max(x, axis=None):  # The largest element; +inf where a NaN is (XLA's max gives NaN).
  return jnp.max(jnp.where(jnp.isnan(x), jnp.inf, x), axis=axis)


def _min(x, axis=None):  # The smallest element; -inf where a NaN is.
  return jnp.min(jnp.where(jnp.isnan(x), -jnp.inf, x), axis=axis)


def _stat_vector(values, width: int):
  out = jnp.zeros((width,), jnp.float32)
  for i, value in enumerate(values):
    out = jnp.where(_iota((width,), 0) == i, value, out)
  return out


def _kernel(*refs, sizes: Sequence[int], batch_size: int, double_q: bool,
            huber_delta: float, row_block: int):
  """One seed's loss, TD errors, metrics and gradients (see the module doc).

  Activations are held transposed, [units, rows]: every product has a layer's units or
  the rows as its first side and transposes in shared memory, not in registers. The batch
  goes through in blocks of `row_block` rows, whose gradients add up; a batch of one block
  writes each layer's gradient as backpropagation reaches it. Both keep fewer values live
  in registers (bench/fused_kernel_resources.py counts the spills).
  """
  num_layers, num_actions = len(sizes) - 1, sizes[-1]
  obs_ref, next_obs_ref, action_ref, reward_ref, discount_ref, weight_ref, mask_ref = refs[:7]
  online_refs = refs[7:7 + 2 * num_layers]
  target_refs = refs[7 + 2 * num_layers:7 + 4 * num_layers]
  stats_ref, td_ref, *grad_refs = refs[7 + 4 * num_layers:]

  def param(param_refs, i, part=0):  # Layer i's weights (0) or biases (1), read where used.
    return _load(param_refs[2 * i + part], (sizes[i], sizes[i + 1])[part:])

  def forward(param_refs, x):
    """The Q-values [actions, rows] and each layer's input: the rows' observations [rows,
    inputs], then each hidden layer's output [units, rows]."""
    inputs = [x]
    for i in range(num_layers - 1):
      x = _relu(pltriton.dot(param(param_refs, i), x, trans_a=True, trans_b=not i)
                + param(param_refs, i, 1)[:, None])
      inputs.append(x)
    last = num_layers - 1
    return (pltriton.dot(x, param(param_refs, last), trans_a=last > 0)
            + param(param_refs, last, 1)[None, :]).T, inputs

  count = _larger(jnp.sum(_load(mask_ref, (batch_size,))), 1.0)

  def one_block(index, carry, write=None):
    totals, grads = carry
    first_row = (index * row_block if write is not None else
                 pl.multiple_of(index * row_block, row_block))
    block = pl.ds(first_row, row_block)
    rows_left = batch_size - first_row  # Rows of this block at or past it are padding.
    row = _iota((row_block,), 0) < rows_left
    actions = _iota((padded(num_actions), row_block), 0)
    valid = row[None, :] & (actions < num_actions)
    # The bootstrap values first: the target (and selector) network's activations are gone
    # before the online network's, kept for backpropagation, are made.
    rows, obs_bounds = (rows_left,), (rows_left, sizes[0])
    next_obs = _load(next_obs_ref, obs_bounds, (block, slice(None)))
    q_t = forward(target_refs, next_obs)[0]
    if double_q:  # The online network's first greedy action, evaluated by the target network.
      # A NaN counts as the largest value, as jnp.argmax takes it (rlax.double_q_learning).
      selector = jnp.where(valid, forward(online_refs, next_obs)[0], -jnp.inf)
      selector = jnp.where(jnp.isnan(selector), jnp.inf, selector)
      best = _max(selector, axis=0)
      first = jnp.min(jnp.where(selector == best[None, :], actions, num_actions), axis=0)
      bootstrap = jnp.sum(jnp.where(actions == first[None, :], q_t, 0.0), axis=0)
    else:
      bootstrap = _max(jnp.where(valid, q_t, -jnp.inf), axis=0)
    q_tm1, inputs = forward(online_refs, _load(obs_ref, obs_bounds, (block, slice(None))))
    taken = valid & (actions == _load(action_ref, rows, block)[None, :])
    q_taken = jnp.sum(jnp.where(taken, q_tm1, 0.0), axis=0)
    td = jnp.where(row, _load(reward_ref, rows, block)
                   + _load(discount_ref, rows, block) * bootstrap - q_taken, 0.0)
    _store(td_ref, td, rows, block)
    block_mask = _load(mask_ref, rows, block)
    scale = _load(weight_ref, rows, block) * block_mask
    if huber_delta > 0:  # rlax.huber_loss and its derivative.
      quadratic = _smaller(jnp.abs(td), huber_delta)
      per_example = 0.5 * quadratic * quadratic + huber_delta * (jnp.abs(td) - quadratic)
      slope = jnp.where(td > huber_delta, huber_delta, _larger(td, -huber_delta))
    else:  # rlax.l2_loss.
      per_example, slope = 0.5 * td * td, td
    totals = (totals[0] + jnp.sum(per_example * scale), totals[1] + jnp.sum(td * block_mask),
              totals[2] + jnp.sum(jnp.abs(td) * block_mask),
              totals[3] + jnp.sum(jnp.where(valid, q_tm1, 0.0)),
              _smaller(totals[4], _min(jnp.where(valid, q_tm1, jnp.inf))),
              _larger(totals[5], _max(jnp.where(valid, q_tm1, -jnp.inf))))
    # d loss / d q_tm1: only the taken action's Q-value, through -td.
    grad = jnp.where(taken, -(slope * scale / count)[None, :], 0.0)  # Then [units, rows].
    grads = list(grads)
    for i in reversed(range(num_layers)):
      layer = (pltriton.dot(inputs[i], grad, trans_b=True) if i else
               pltriton.dot(grad, inputs[0]).T, jnp.sum(grad, axis=1))
      if write is not None:  # The batch's one block: out now.
        write(i, *layer)
      else:
        grads[2 * i:2 * i + 2] = [g + d for g, d in zip(grads[2 * i:2 * i + 2], layer)]
      if i:
        back = pltriton.dot(param(online_refs, i), grad)
        grad = jnp.where(inputs[i] > 0.0, back, 0.0)
    return totals, tuple(grads)

  start = tuple(jnp.float32(x) for x in (0.0, 0.0, 0.0, 0.0, jnp.inf, -jnp.inf))
  num_blocks = -(-batch_size // row_block)  # None of padding alone.
  squares = []

  def write(i, w_grad, b_grad):
    _store(grad_refs[2 * i], w_grad, (sizes[i], sizes[i + 1]))
    _store(grad_refs[2 * i + 1], b_grad, (sizes[i + 1],))
    squares.extend([jnp.sum(w_grad * w_grad), jnp.sum(b_grad * b_grad)])

  if num_blocks == 1:
    totals, _ = one_block(0, (start, (None,) * len(grad_refs)), write)
  else:
    zeros = tuple(jnp.zeros(ref.shape, jnp.float32) for ref in grad_refs)
    totals, grads = jax.lax.fori_loop(0, num_blocks, one_block, (start, zeros))
    for i in range(num_layers):
      write(i, grads[2 * i], grads[2 * i + 1])
  loss, td_sum, td_abs_sum, q_sum, q_min, q_max = totals
  _store(stats_ref, _stat_vector(  # The gradient's padding is 0 (masked inputs and weights).
      (loss / count, td_sum / count, td_abs_sum / count, q_sum / (batch_size * num_actions),
       q_min, q_max, sum(squares)), stats_ref.shape[0]), (len(STATS),))


def _f32(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _layers_f32(layer_shapes):  # Each layer's weights and biases.
  return [x for w in layer_shapes for x in (_f32(*w), _f32(w[1]))]


def _full(shape):
  """A BlockSpec of the whole (padded) array, for a program without a grid."""
  return pl.BlockSpec(tuple(padded(d) for d in shape), lambda: (0,) * len(shape))


def _run_kernel(arrays, layer_shapes, batch_size: int, double_q: bool, huber_delta: float,
                interpret: bool):
  """The kernel on one seed's arrays: (metrics [len(STATS)], td [B], (w, b) gradients per layer)."""
  sizes = [layer_shapes[0][0]] + [w[1] for w in layer_shapes]
  out_shapes = [_f32(len(STATS)), _f32(batch_size), *_layers_f32(layer_shapes)]
  compiler_params = (None if interpret else
                     pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1))
  kernel = functools.partial(_kernel, sizes=tuple(sizes), batch_size=batch_size,
                             double_q=double_q, huber_delta=huber_delta,
                             row_block=min(ROW_BLOCK, padded(batch_size)))
  return pl.pallas_call(
      kernel, out_shape=out_shapes,
      in_specs=[_full(a.shape) for a in arrays],
      out_specs=[_full(s.shape) for s in out_shapes],
      compiler_params=compiler_params, interpret=interpret, name="fused_q_learning_loss",
  )(*arrays)


_FITS: set = set()  # Sizes this process's GPU was found to hold (`check_fits`).
SHARED_MEMORY = re.compile(r"Shared memory size limit exceeded: requested (\d+), available: (\d+)")


def check_fits(observation_size: int, hidden_sizes: Sequence[int], num_actions: int,
               batch_size: int, double_q: bool, huber_delta: float,
               compile_kernel: Optional[Any] = None) -> None:
  """On a GPU, compiles the kernel alone for these sizes: a ValueError naming `fused_loss` if the
  GPU lacks the shared memory it asks for (set by every layer, the batch and `double_q`).
  Elsewhere it does nothing. `compile_kernel(fn, *shapes)` replaces the compile (a GPU
  compiler without the GPU)."""
  widths = [observation_size, *hidden_sizes, num_actions]
  key = (*widths, batch_size, double_q, huber_delta) if compile_kernel is None else None
  if key is not None:
    if jax.default_backend() != "gpu" or key in _FITS:
      return
    compile_kernel = lambda fn, *shapes: jax.jit(fn).lower(*shapes).compile()  # noqa: E731
  layer_shapes = list(zip(widths[:-1], widths[1:]))
  arrays = [_f32(batch_size, observation_size), _f32(batch_size, observation_size),
            jax.ShapeDtypeStruct((batch_size,), jnp.int32), *[_f32(batch_size)] * 4,
            *_layers_f32(layer_shapes) * 2]  # Online and target.
  try:
    compile_kernel(lambda *a: _run_kernel(a, layer_shapes, batch_size, double_q, huber_delta,
                                          interpret=False), *arrays)
  except Exception as error:  # pylint: disable=broad-except
    found = SHARED_MEMORY.search(str(error))
    if not found:
      raise
    requested, available = (int(n) / 1024 for n in found.groups())
    raise ValueError(
        f"`fused_loss`=True: its kernel asks for {requested:.0f} KiB of the GPU's shared "
        f"memory per program, and this GPU has {available:.0f} KiB (layers "
        f"{','.join(map(str, widths))}, `batch_size`={batch_size}, `double_q`={double_q}). "
        "Use narrower layers (`hidden_sizes`) or `double_q`=False, or drop `fused_loss`."
    ) from None
  if key is not None:
    _FITS.add(key)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _loss_and_stats(options: Tuple[Any, ...], online, target, batch_arrays):
  """(stats, td): the loss is stats[0]; the gradient comes from the same kernel call."""
  return _loss_fwd(options, online, target, batch_arrays)[0]


def _loss_fwd(options, online, target, batch_arrays):
  layer_shapes = [w.shape for w, _ in online]
  stats, td, *grads = _run_kernel([*batch_arrays, *jax.tree.leaves((online, target))],
                                   layer_shapes, batch_arrays[0].shape[0], *options)
  return (stats, td), list(zip(grads[::2], grads[1::2]))


def _loss_bwd(_, grads, cotangents):  # The options are the kernel's, not differentiated.
  scale = cotangents[0][0]  # The loss's; the TD errors and the metrics are not differentiated.
  return (jax.tree.map(lambda g: g * scale, grads), None, None)


_loss_and_stats.defvjp(_loss_fwd, _loss_bwd)


@dataclasses.dataclass(frozen=True)
class FusedQLearningLoss:
  """`losses.QLearningLoss` for the plain MLP Q-network, in one kernel (see the module doc).

  Attributes:
    double_q: select the bootstrap action with the online network (Double DQN).
    huber_delta: Huber loss threshold; 0 gives the squared loss 0.5 * td**2.
    interpret: run the kernel in Pallas's interpreter (any backend) instead
      of compiling it with Triton (GPUs); None: interpret unless the program
      is built for a GPU (`xla_setup.target_platform`).
  """
  double_q: bool = False
  huber_delta: float = 1.0
  interpret: Optional[bool] = None

  def __call__(self, apply_fn, online_params: Params, target_params: Params,
               batch: Transition, weights: Optional[chex.Array] = None,
               mask: Optional[chex.Array] = None):
    """Returns (scalar loss, LossExtras), as `QLearningLoss`; `apply_fn` is not called."""
    del apply_fn  # The kernel applies the MLP itself.
    chex.assert_rank(batch.action, 1)
    batch_size = batch.action.shape[0]
    weights, mask = default_weights_and_mask(batch, weights, mask)
    names = mlp_layer_names(online_params)

    def layers(params):
      return [(params[n]["w"], params[n]["b"]) for n in names]

    def flat(obs):
      return obs.reshape(batch_size, -1).astype(jnp.float32)

    batch_arrays = (flat(batch.observation), flat(batch.next_observation),
                    batch.action.astype(jnp.int32), batch.reward.astype(jnp.float32),
                    batch.discount.astype(jnp.float32),
                    weights.astype(jnp.float32), mask.astype(jnp.float32))
    interpret = (xla_setup.target_platform() != "gpu" if self.interpret is None
                 else self.interpret)
    stats, td_error = _loss_and_stats(
        (self.double_q, self.huber_delta, interpret), layers(online_params),
        layers(jax.lax.stop_gradient(target_params)), batch_arrays)
    loss, (stats, td_error) = stats[0], jax.lax.stop_gradient((stats, td_error))
    metrics = dict(zip(STATS[1:-1], stats[1:-1]))  # All but the loss and the gradient's norm.
    return loss, LossExtras(td_error, jnp.abs(td_error), metrics, grad_squared_norm=stats[-1])
