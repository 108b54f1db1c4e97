"""Anakin mode: n-step targets equal the local adder's, the learner step is the local learner's,
runs are deterministic per seed and differ across seeds, a short run learns, bad input is named."""

import functools
import json
import os
import subprocess
import sys
import threading
import time
import types

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import anakin
from acme_jax_dqn import checkpointing
from acme_jax_dqn import envs
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import specs
from acme_jax_dqn import xla_setup
from acme_jax_dqn.adders import NStepTransitionAdder
from acme_jax_dqn.types import Transition
from agents.dqn import anakin as dqn_anakin
from agents.dqn import seed_layout
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ConfigError, DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment
from bench import hlo_count
from tests.fakes import ROOT, damage_checkpoints

GAMMA = 0.9


def _random_streams(rng, num_envs, steps):
  """Per env and step: obs, action, reward, terminated, truncated, next obs (gymnax style)."""
  obs = rng.normal(size=(steps + 1, num_envs)).astype(np.float32)
  final = rng.normal(size=(steps, num_envs)).astype(np.float32)  # Last obs at an episode end.
  terminated = rng.random((steps, num_envs)) < 0.12
  truncated = ~terminated & (rng.random((steps, num_envs)) < 0.08)
  end = terminated | truncated
  next_obs = np.where(end, final, obs[1:])
  return (obs[:-1], rng.integers(0, 3, (steps, num_envs)), rng.normal(size=(steps, num_envs)),
          terminated, truncated, next_obs)


def _local_transitions(stream, env, n_step):
  """The local adder fed the dm_env view of one env's stream (LAST, then a FIRST restart)."""
  obs, action, reward, terminated, truncated, next_obs = stream
  out = {}

  def sink(t: Transition):
    for i in range(len(t.action)):
      out[float(t.observation[i, 0])] = tuple(float(np.ravel(x[i])[0]) for x in t)

  adder = NStepTransitionAdder(sink, n_step, GAMMA, num_envs=1)
  ts = lambda step_type, r, d, o: dm_env.TimeStep(
      np.array([step_type]), np.array([r], np.float32), np.array([d], np.float32),
      np.array([[o]], np.float32))
  adder.add_first(ts(dm_env.StepType.FIRST, 0.0, 1.0, obs[0, env]))
  for t in range(len(action)):
    ended = terminated[t, env] or truncated[t, env]
    step_type = dm_env.StepType.LAST if ended else dm_env.StepType.MID
    adder.add(np.array([action[t, env]]),
              ts(step_type, reward[t, env], 0.0 if terminated[t, env] else 1.0, next_obs[t, env]))
    if ended and t + 1 < len(action):
      adder.add(np.array([0]), ts(dm_env.StepType.FIRST, 0.0, 1.0, obs[t + 1, env]))
  return out


@pytest.mark.parametrize("n_step", [1, 3])
def test_nstep_window_writes_what_the_local_adder_writes(n_step):
  rng = np.random.default_rng(n_step)
  num_envs, steps = 4, 60
  stream = _random_streams(rng, num_envs, steps)
  obs, action, reward, terminated, truncated, next_obs = stream
  emit = jax.jit(anakin.nstep_transition, static_argnums=1)
  window = None
  compared = 0
  for t in range(steps):
    entry = anakin.NStepWindow(obs[t][:, None], action[t], reward[t].astype(np.float32),
                               1.0 - terminated[t].astype(np.float32),
                               terminated[t] | truncated[t], next_obs[t][:, None])
    window = (jax.tree.map(lambda x: np.repeat(x[None] * 0, n_step, 0), entry)
              if window is None else window)
    window = jax.tree.map(lambda w, x: np.concatenate([w[1:], x[None]]), window, entry)
    if t < n_step - 1:
      continue  # The window is not full yet: its oldest entries are not real steps.
    got = jax.tree.map(np.asarray, emit(window, GAMMA))
    for env in range(num_envs):
      expected = _local_transitions(stream, env, n_step)[float(got.observation[env, 0])]
      actual = tuple(float(np.ravel(x[env])[0]) for x in got)
      np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
      compared += 1
  assert compared == num_envs * (steps - n_step + 1)
  assert terminated.any() and truncated.any()


def _tiny_config(**overrides):
  values = dict(hidden_sizes=(64, 64), batch_size=64, min_replay_size=500,
                replay_capacity=10_000, samples_per_insert=16.0, num_envs=4,
                learning_rate=1e-3, target_update_period=1, target_update_tau=0.01,
                epsilon_decay_steps=2000, epsilon_end=0.02)
  values.update(overrides)
  return DQNConfig(**values)


@pytest.mark.parametrize("overrides", [
    {},
    dict(double_q=True, dueling=True, distributional=True, num_atoms=11, v_min=0.0,
         v_max=50.0, n_step=3, prioritized=True, importance_sampling_anneal_steps=100),
])
def test_anakin_learn_step_equals_the_local_learner_step(overrides):
  """The anakin trainer's learn step and the local Learner run the same function on the same data."""
  config = _tiny_config(**overrides)
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  networks = builder.make_networks(env.spec)
  trainer = builder.make_anakin(env, networks, eval_episodes=2)
  state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
  # Fill the replay with real transitions (400; learning would start at 500).
  state, _ = jax.jit(trainer.train_chunk, static_argnums=2)(state, 0, 100)
  assert int(state.learner.steps) == 0

  replay_buffer = builder.make_replay_buffer(env.spec)
  learner = builder.make_learner(networks, replay_buffer, jax.random.PRNGKey(1))
  learner.restore(state.learner)
  # The local replay stores a leaf per field; anakin's stores its items packed.
  items = replay_lib.item_codec(builder.example_transition(env.spec)).decode(
      state.buffer.experience)
  replay_buffer.state = jax.tree.map(jnp.copy, state.buffer.replace(experience=items))
  learner.step()

  new_state, metrics = jax.jit(trainer.learn)(state)
  np.testing.assert_allclose(learner.metrics()["loss"], metrics["loss"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               learner.state.online_params, new_state.learner.online_params)
  assert int(new_state.learner.steps) == int(learner.state.steps) == int(state.learner.steps) + 1
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                       new_state.learner.online_params,
                                       state.learner.online_params))
  assert max(moved) > 0  # The step changed the parameters.


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_warmup_as_loops_trains_what_the_per_iteration_conditional_trains(num_seeds):
  """`train_chunk(..., warmup=w)` runs a chunk's warm-up and learning iterations as two loops;
  chunk by chunk, across the start of learning, it trains what the conditional on the
  iteration index trains (one seed unbatched, two vmapped)."""
  from agents.dqn.seed_layout import over_seeds  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=300)  # 4 inserts per iteration.
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
  # Iteration i learns once (i + 1) * 4 >= 300: iterations 0-73 fill replay.
  assert trainer.warmup_iterations == 74
  warmups = [anakin.chunk_warmup(trainer, c * 30, 30) for c in range(4)]
  assert warmups == [30, 30, 14, 0]
  batched = num_seeds > 1
  keys = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in range(num_seeds)])
  init = jax.jit(over_seeds(trainer.init, batched))

  def run(per_chunk):
    chunk = {w: jax.jit(over_seeds(functools.partial(trainer.train_chunk, num_iterations=30,
                                                     warmup=w), batched, in_axes=(0, None)))
             for w in set(per_chunk)}
    state, rows = init(keys), []
    for c, w in enumerate(per_chunk):
      state, metrics = chunk[w](state, np.int32(c * 30))
      rows.append(jax.device_get(metrics))
    return jax.device_get(state.learner.online_params), rows

  params_cond, rows_cond = run([None] * 4)
  params_loops, rows_loops = run(warmups)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               params_cond, params_loops)
  assert [int(r["learner_steps"][0]) for r in rows_loops] == [0, 0, 16, 46]
  for cond_row, loops_row in zip(rows_cond, rows_loops):
    assert set(cond_row) == set(loops_row)
    for name in cond_row:
      np.testing.assert_allclose(np.asarray(cond_row[name], np.float64),
                                 np.asarray(loops_row[name], np.float64), rtol=1e-5)
  assert np.all(np.isnan(rows_loops[1]["loss"])) and np.all(np.isfinite(rows_loops[2]["loss"]))


def test_an_unrolled_chunk_trains_what_the_rolled_chunk_trains():
  """`unroll`=3 (--scan_unroll) runs 3 iterations per loop step, also where a loop's length is
  no multiple of 3: a chunk of 20 iterations across the start of learning (14 warm-up, 6
  learning), with the conditional and with the warm-up loops, and two seeds vmapped with the
  loops, trains the same parameters and gives the same row as with one iteration per step:
  bit for bit for one seed, to float rounding for the vmapped programs."""
  from agents.dqn import anakin as anakin_mode  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=300)  # 4 inserts per iteration: iteration 74 learns.
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)

  def run(warmup, batched, unroll):  # Iterations 60-79.
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(1 + batched)])
    start = jax.jit(seed_layout.over_seeds(trainer.init, batched))(keys)
    chunk = jax.jit(anakin_mode.chunk_fn(trainer, 20, warmup, batched, unroll))
    state, metrics = chunk(start, np.int32(60))
    return jax.device_get(state.learner.online_params), jax.device_get(metrics)

  for warmup, batched in ((None, False), (14, False), (14, True)):
    params, row = run(warmup, batched, 1)
    assert np.all(np.asarray(row["learner_steps"]) == 6)
    unrolled_params, unrolled_row = run(warmup, batched, 3)
    same = (functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-8) if batched
            else np.testing.assert_array_equal)
    jax.tree.map(same, params, unrolled_params)
    assert set(row) == set(unrolled_row)
    for name in row:
      same(np.asarray(row[name], np.float64), np.asarray(unrolled_row[name], np.float64))


def test_acting_apart_puts_a_barrier_before_the_acting_forward_and_trains_the_same():
  """With `acting_apart` the loop that learns acts on the online parameters through an
  optimization barrier (so that a GPU compiler cannot merge the acting forward into the
  learner's): only that program holds one, and two vmapped seeds train the same parameters and
  row as without it (on the CPU, which merges nothing). `seed_layout.acting_apart`, the run's
  default, picks it for a batch of seeds built for a GPU, never for one seed, the CPU or a
  TPU."""
  from agents.dqn import anakin as anakin_mode  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=300)  # 4 inserts per iteration: iteration 74 learns.
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
  keys = jnp.stack([jax.random.PRNGKey(s) for s in range(2)])
  start = jax.jit(seed_layout.over_seeds(trainer.init, True))(keys)

  def run(acting_apart):  # Iterations 60-79: 14 of warm-up, 6 that learn.
    chunk = anakin_mode.chunk_fn(trainer, 20, 14, True, acting_apart=acting_apart)
    barriers = str(jax.make_jaxpr(chunk)(start, np.int32(60))).count("optimization_barrier")
    state, metrics = jax.jit(chunk)(start, np.int32(60))
    return barriers, jax.device_get(state.learner.online_params), jax.device_get(metrics)

  barriers, params, row = run(False)
  apart_barriers, apart_params, apart_row = run(True)
  assert (barriers, apart_barriers) == (0, 1)
  assert np.all(np.asarray(row["learner_steps"]) == 6)
  jax.tree.map(np.testing.assert_array_equal, params, apart_params)
  assert set(row) == set(apart_row)
  for name in row:
    np.testing.assert_array_equal(np.asarray(row[name]), np.asarray(apart_row[name]))
  assert seed_layout.acting_apart(True) == (jax.default_backend() == "gpu")
  assert not seed_layout.acting_apart(False)
  with xla_setup.building_for("tpu"):
    assert not seed_layout.acting_apart(True)

  def default_barriers(batched):  # The run's chunk (acting_apart None: the default), for a GPU.
    with xla_setup.building_for("gpu"):
      chunk = anakin_mode.chunk_fn(trainer, 20, 14, batched)
      seeds = start if batched else jax.tree.map(lambda x: x[:1], start)  # Two seeds, or one.
      return str(jax.make_jaxpr(chunk)(seeds, np.int32(60))).count("optimization_barrier")
  assert (default_barriers(True), default_barriers(False)) == (1, 0)


def test_target_update_in_a_loop_trains_the_same_and_is_the_default_for_large_targets(
    monkeypatch):
  """With `target_loop` the run's chunk moves the target in a loop that runs only when an
  update is due (one `while` more in the program, inside the loops over an iteration's 2
  learner calls and a call's 2 SGD steps and, with the conditional, inside its branch, all of
  whose bodies the trainer traced once before, without the loop): two vmapped seeds with a
  hard update every 2 steps train the same parameters and row as with the select (the warm-up
  as a loop of its own; with the conditional the loop is there too).
  `seed_layout.target_update_loop`, the run's default, picks it on an accelerator where the
  select would move at least `TARGET_LOOP_MIN_BYTES`, never on the CPU."""
  from agents.dqn import anakin as anakin_mode  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=300, target_update_period=2, target_update_tau=1.0,
                        num_sgd_steps_per_step=2, samples_per_insert=64.0)
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
  assert trainer.learner_calls_per_iteration == 2
  keys = jnp.stack([jax.random.PRNGKey(s) for s in range(2)])
  start = jax.jit(seed_layout.over_seeds(trainer.init, True))(keys)

  def loops(chunk):
    return str(jax.make_jaxpr(chunk)(start, np.int32(60))).count(" while[")

  def run(warmup, target_loop):  # Iterations 60-79: 14 of warm-up, 6 that learn.
    chunk = anakin_mode.chunk_fn(trainer, 20, warmup, True, target_loop=target_loop)
    state, metrics = jax.jit(chunk)(start, np.int32(60))
    return (loops(chunk), jax.device_get(state.learner.online_params),
            jax.device_get(state.learner.target_params), jax.device_get(metrics))

  select_loops, params, target, row = run(14, False)
  loop_loops, loop_params, loop_target, loop_row = run(14, True)
  assert loop_loops == select_loops + 1
  assert np.all(np.asarray(row["learner_steps"]) == 6 * 2 * 2)
  jax.tree.map(np.testing.assert_array_equal, (params, target), (loop_params, loop_target))
  jax.tree.map(np.testing.assert_array_equal, target, params)  # 24 steps: the last copied.
  assert set(row) == set(loop_row)
  for name in row:
    np.testing.assert_array_equal(np.asarray(row[name]), np.asarray(loop_row[name]))
  conditional = lambda target_loop: anakin_mode.chunk_fn(  # noqa: E731 (warmup None)
      trainer, 20, None, True, target_loop=target_loop)
  assert loops(conditional(True)) == loops(conditional(False)) + 1

  select_bytes = 3 * xla_setup.nbytes(start.learner.target_params)  # Two seeds' select.
  monkeypatch.setattr(seed_layout, "TARGET_LOOP_MIN_BYTES", select_bytes)
  for platform, loop in (("cpu", False), ("gpu", True), ("tpu", True)):
    with xla_setup.building_for(platform):
      assert seed_layout.target_update_loop(select_bytes // 3) == loop
      assert not seed_layout.target_update_loop(select_bytes // 3 - 1)
  with xla_setup.building_for("gpu"):  # The run's chunk (target_loop None) asks the rule.
    chunk = lambda target_loop=None: anakin_mode.chunk_fn(trainer, 20, 14, True,  # noqa: E731
                                                          target_loop=target_loop)
    assert loops(chunk()) == loops(chunk(True)) == 1
    monkeypatch.setattr(seed_layout, "TARGET_LOOP_MIN_BYTES", select_bytes + 3)
    assert loops(chunk()) == loops(chunk(False)) == 0
  monkeypatch.undo()
  with xla_setup.building_for("gpu"):  # 2,048 seeds of the PureJaxRL preset's network.
    assert seed_layout.target_update_loop(2048 * 10_934 * 4)
    assert not seed_layout.target_update_loop(64 * 10_934 * 4)


def test_scan_unroll_runs_several_iterations_per_loop_step_of_the_runs_chunk():
  """In the chunk program a run with `scan_unroll` builds (`AnakinPlan.chunk_fn`), the loop
  over a learning chunk's 12 iterations steps 12 times, or 6 with `scan_unroll`=2."""
  from agents.dqn.anakin import AnakinPlan  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=4)  # Learns from the first iteration.
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
  state = jax.eval_shape(seed_layout.over_seeds(trainer.init, False),
                         jax.random.PRNGKey(0)[None])  # One seed, as a run lays it out.

  def trip_counts(unroll):  # 48 env steps of 4 copies: one chunk of 12 iterations.
    experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", total_steps=48,
                                  log_every=48, scan_unroll=unroll)
    plan = AnakinPlan(trainer, config, experiment)
    assert (plan.num_chunks, plan.iterations_per_chunk) == (1, 12)
    chunk = plan.chunk_fn(trainer, warmup=0, batched=False)
    return hlo_count.entry_trip_counts(
        jax.jit(chunk).lower(state, np.int32(0)).compile().as_text())

  assert trip_counts(1) == [12] and trip_counts(2) == [6]


def test_summed_scan_sums_every_leaf_of_the_outputs_in_float32():
  def body(count, _):  # Outputs 1, 2, 3 (float), their squares (int) and whether odd (bool).
    count = count + 1
    return count, {"x": count.astype(jnp.float32), "sq": (count * count)[None],
                   "odd": count % 2 == 1}
  count, sums = jax.jit(lambda c: anakin.summed_scan(body, c, 3))(jnp.int32(0))
  assert int(count) == 3
  assert float(sums["x"]) == 6.0 and sums["sq"].shape == (1,) and float(sums["sq"][0]) == 14.0
  assert float(sums["odd"]) == 2.0  # A count, not an "or".
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(sums))


def test_an_accelerator_runs_the_warmup_as_loops_for_one_seed_and_the_cpu_a_conditional():
  """A chunk of 4 iterations across the start of learning (2 warm-up, 2 learning), as the run
  builds it. On the CPU one seed's chunk keeps the conditional on the iteration index and
  the non-finite guard's conditional; traced for a GPU it has neither (the warm-up is a loop
  of its own, the guard a select). A batch of seeds has no conditional on either."""
  from agents.dqn import anakin as anakin_mode  # pylint: disable=import-outside-toplevel
  config = _tiny_config(min_replay_size=300)  # 4 inserts per iteration: iteration 74 learns.
  env = envs.make_jax_environment("gymnax:CartPole-v1")

  def chunk_jaxpr(batched):
    builder = DQNBuilder(config)
    trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
    warmup = (anakin.chunk_warmup(trainer, 72, 4) if seed_layout.warmup_loops(batched)
              else None)
    assert warmup in (None, 2)
    chunk = anakin_mode.chunk_fn(trainer, 4, warmup, batched)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(1 + batched)])
    state = jax.eval_shape(seed_layout.over_seeds(trainer.init, batched), keys)
    return str(jax.make_jaxpr(chunk)(state, np.int32(72)))

  assert not seed_layout.warmup_loops(False) and seed_layout.warmup_loops(True)
  assert chunk_jaxpr(False).count(" cond[") == 2  # The warm-up's and the guard's.
  assert " cond[" not in chunk_jaxpr(True)
  with xla_setup.building_for("gpu"):
    assert seed_layout.warmup_loops(False)
    gpu = chunk_jaxpr(False)
    assert " cond[" not in gpu and gpu.count(" scan[") >= 2  # Two loops, no conditional.


def test_a_device_with_a_batch_of_seeds_runs_the_warmup_as_loops(tmp_path, monkeypatch):
  """Two seeds on one CPU device: chunk 0 (124 warm-up iterations, then learning) and the
  learning chunks after it are two programs; the run trains what the per-iteration
  conditional trains (same parameters, same learner steps)."""
  warmups_planned = []
  original = anakin.chunk_warmup
  monkeypatch.setattr(anakin, "chunk_warmup",
                      lambda *args: warmups_planned.append(original(*args)) or warmups_planned[-1])

  def run(name):
    experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", seed=0,
                                  num_seeds=2, cpu_devices=1, total_steps=2400, log_every=800,
                                  eval_episodes=2, logdir=str(tmp_path / name), quiet=True,
                                  loggers=("csv",))
    return run_experiment(experiment, _tiny_config())

  loops = run("loops")
  assert warmups_planned == [124, 0, 0]  # 600 iterations in chunks of 200; learning starts at 124.
  monkeypatch.setattr(seed_layout, "warmup_loops", lambda batched: False)
  conditional = run("conditional")
  assert loops["seed_devices"] == conditional["seed_devices"] == 1
  assert loops["learner_steps"] == conditional["learner_steps"] == 600 - 124
  assert loops["params_checksum"] == conditional["params_checksum"]
  # Where compile_s went: each program is lowered before it compiles, and a CPU run is ready
  # once every program has compiled and the init has run, within compile_s.
  phases = loops["compile_phases_s"]
  assert set(phases) == {"environment_made", "init_lowered", "init_compiled",
                         "first_chunk_lowered", "first_chunk_compiled", "evaluation_compiled",
                         "chunk_2_compiled", "all_lowered", "ready"}, phases
  assert phases["environment_made"] <= phases["init_lowered"]
  assert phases["init_lowered"] <= phases["first_chunk_lowered"] <= phases["all_lowered"]
  assert phases["init_lowered"] <= phases["init_compiled"]
  assert phases["first_chunk_lowered"] <= phases["first_chunk_compiled"]
  assert max(phases.values()) == phases["ready"] <= loops["compile_s"]


@pytest.mark.parametrize("workers, most_at_once", [(None, [2, 3, 4]), (1, [1])])
def test_the_first_chunk_is_queued_right_after_the_init_and_workers_set_the_overlap(
    monkeypatch, workers, most_at_once):
  """Two seeds on one CPU device, learning starting in the first of three chunks: the init,
  the first chunk, the evaluation and the learning chunk are queued in that order, compiled
  side by side by default and one at a time with `compile_workers=1`."""
  from agents.dqn.anakin import AnakinSource  # pylint: disable=import-outside-toplevel
  lock, running, calls, most = threading.Lock(), [0], [], [0]
  original = jax.stages.Lowered.compile

  def compile_and_count(lowered, *args, **kwargs):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
      calls.append(len(lowered.in_tree.children()[0].children()))  # The program's arguments.
    time.sleep(0.2)  # Long enough for programs queued side by side to overlap.
    try:
      return original(lowered, *args, **kwargs)
    finally:
      with lock:
        running[0] -= 1

  monkeypatch.setattr(jax.stages.Lowered, "compile", compile_and_count)
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                                cpu_devices=1, total_steps=2400, log_every=800, eval_episodes=2,
                                quiet=True)
  source = AnakinSource(experiment, _tiny_config(), compile_workers=workers)
  assert source.chunk_programs == 2
  # (keys,), (state, first iteration), (params, keys, index), then the learning chunk.
  assert calls == [1, 2, 3, 2]
  assert most[0] in most_at_once


def _run_anakin(tmp_path, name, seed=0, num_seeds=2, total_steps=8000, **overrides):
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", seed=seed,
                                total_steps=total_steps, logdir=str(tmp_path / name),
                                eval_episodes=5, log_every=2000, quiet=True,
                                num_seeds=num_seeds)
  summary = run_experiment(experiment, _tiny_config(**overrides))
  with open(tmp_path / name / "train.csv") as f:
    train = f.read()
  return summary, train


def test_anakin_runs_are_deterministic_differ_across_seeds_and_learn(tmp_path):
  first, first_csv = _run_anakin(tmp_path, "a")
  second, second_csv = _run_anakin(tmp_path, "b")
  # Same seed: identical metrics (wall-clock columns aside) and returns.
  strip = lambda csv: [row.split(",")[:2] + row.split(",")[4:] for row in csv.splitlines()]
  header = first_csv.splitlines()[0].split(",")
  assert header[2:4] == ["wall_s", "sps"]
  assert strip(first_csv) == strip(second_csv)
  assert first["eval_return_per_seed"] == second["eval_return_per_seed"]
  # Different seeds within one program learn different things.
  per_seed = first["eval_return_per_seed"]
  assert len(per_seed) == 2 and per_seed[0] != per_seed[1]
  # A random policy lasts ~22 steps on CartPole; after 8,000 steps both seeds do clearly better.
  assert min(per_seed) > 50, per_seed
  assert first["env_steps"] <= 8000 and first["learner_steps"] > 0
  assert first["samples_per_insert_effective"] == pytest.approx(16.0, rel=0.05)
  with open(tmp_path / "a" / "summary.json") as f:
    on_disk = json.load(f)
  for field in ("env", "run_mode", "seed", "env_steps", "learner_steps", "wall_s", "compile_s",
                "imports_s",
                "sps", "sps_after_compile", "eval_return_mean", "eval_return_std",
                "eval_episodes", "config", "eval_return_per_seed"):
    assert field in on_disk
  assert on_disk["run_mode"] == "anakin"


def test_prng_impl_draws_other_streams_restores_jax_default_and_guards_resume(tmp_path):
  runs = {}
  for impl in ("unsafe_rbg", "threefry2x32"):
    experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", total_steps=2000,
                                  logdir=str(tmp_path / impl), eval_episodes=2, log_every=1000,
                                  quiet=True, prng_impl=impl)
    runs[impl] = run_experiment(experiment, _tiny_config(num_envs=2, min_replay_size=200))
    # The run's PRNG applies within it; JAX's default is back afterwards.
    assert jax.config.jax_default_prng_impl == "threefry2x32"
    assert jax.random.PRNGKey(0).shape == (2,)
  assert runs["unsafe_rbg"]["prng_impl"] == "unsafe_rbg"
  # Other keys, other episodes: the two runs' learner losses differ.
  losses = {}
  for impl in runs:
    with open(tmp_path / impl / "train.csv") as f:
      header, *rows = [line.split(",") for line in f.read().splitlines()]
    losses[impl] = [row[header.index("loss")] for row in rows]
  assert losses["unsafe_rbg"] != losses["threefry2x32"]
  # A resume with another PRNG is refused before compiling, naming the fix.
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"`prng_impl`=threefry2x32 \(checkpoint: unsafe_rbg\)"):
    run_experiment(ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin",
                                    total_steps=2000, logdir=str(tmp_path / "unsafe_rbg"),
                                    quiet=True, eval_episodes=2, log_every=1000, resume=True),
                   _tiny_config(num_envs=2, min_replay_size=200))
  with pytest.raises(ValueError, match="`prng_impl`='philox'"):
    ExperimentConfig(prng_impl="philox")


def test_evaluations_land_on_the_chunk_end_nearest_each_multiple_of_eval_every(tmp_path):
  # Iterations of 4 env steps after a 2-step n-step fill: chunks end at 250,
  # 498, 746 and 994, so three of them fall just short of a multiple of 250.
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", total_steps=1000,
                                logdir=str(tmp_path), eval_every=250, eval_episodes=2,
                                quiet=True, num_seeds=1, save_checkpoints=False)
  config = _tiny_config(num_envs=1, batch_size=16, samples_per_insert=4.0, n_step=3,
                        min_replay_size=100)
  run_experiment(experiment, config)
  with open(tmp_path / "eval.csv") as f:
    steps = [int(line.split(",")[0]) for line in f.read().splitlines()[1:]]
  assert steps == [250, 498, 746, 994]


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "launch.run_dqn", "--quiet", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, expected", [
    (["--run_mode=anakin", "--env=gymnasium:CartPole-v1"], "gymnax:CartPole-v1"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--num_envs=0"], "--num_envs"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--num_seeds=0"], "--num_seeds"),
    (["--run_mode=local", "--num_seeds=3"], "--run_mode=anakin"),
    (["--run_mode=anakin", "--env=gymnax:CartPole-v1", "--scan_unroll=0"], "--scan_unroll"),
    (["--run_mode=local", "--scan_unroll=2"], "--run_mode=anakin"),
    (["--run_mode=anakin", "--env=gymnax:Pendulum-v1"], "not discrete"),
    (["--run_mode=anakin", "--env=gymnax:CartPole"], "CartPole-v1"),
])
def test_bad_anakin_input_is_named(args, expected, tmp_path):
  result = _cli(*args, f"--logdir={tmp_path}")
  assert result.returncode == 2, result.stderr[-2000:]
  assert "error:" in result.stderr and expected in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


def test_minatar_gets_the_small_conv_torso_and_the_gymnax_spec():
  env = envs.make_jax_environment("gymnax:Breakout-MinAtar")
  assert env.spec.observations.shape == (10, 10, 4) and env.spec.actions.num_values == 3
  networks = DQNBuilder(_tiny_config()).make_networks(env.spec)
  params = networks.init(jax.random.PRNGKey(0))
  assert any("minatar_conv_torso" in name for name in params)
  q = networks.apply(params, jnp.zeros((2, 10, 10, 4))).q_values
  assert q.shape == (2, 3)


def test_gymnax_local_adapter_keeps_truncation_apart_from_termination():
  """MountainCar's 200-step limit ends a random episode: LAST with discount 1 (bootstrap)."""
  env = envs.make_environment("gymnax:MountainCar-v0", seed=0)
  assert specs.make_environment_spec(env).actions.num_values == 3
  timestep, steps = env.reset(), 0
  assert timestep.first()
  while not timestep.last():
    timestep = env.step(1)  # "Do nothing": never reaches the goal.
    steps += 1
  assert steps == 200 and timestep.discount == 1.0
  cartpole = envs.make_environment("gymnax:CartPole-v1", seed=0)
  timestep = cartpole.reset()
  while not timestep.last():
    timestep = cartpole.step(0)  # Always push left: the pole falls, a termination.
  assert timestep.discount == 0.0


def test_apex_epsilons_are_one_fixed_value_per_env_copy():
  config = _tiny_config(apex_epsilons=True, apex_epsilon_base=0.4, apex_epsilon_alpha=7.0)
  schedule = DQNBuilder(config).make_epsilon_schedule(num_envs=4)
  expected = [0.4 ** (1 + 7 * i / 3) for i in range(4)]
  np.testing.assert_allclose(schedule(0), expected, rtol=1e-6)
  np.testing.assert_allclose(schedule(10**6), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(schedule)(jnp.int32(5)), expected, rtol=1e-6)


def test_one_cpu_core_run_completes_and_affinity_is_restored(tmp_path):
  result = _cli("--run_mode=anakin", "--env=gymnax:CartPole-v1", "--total_steps=400",
                "--min_replay_size=100", "--num_envs=2", "--hidden_sizes=16", "--batch_size=16",
                "--eval_episodes=2", "--one_cpu_core", "--compilation_cache_dir=",
                f"--logdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  assert summary["experiment"]["one_cpu_core"] and summary["env_steps"] > 0
  # In this process the CPU client exists already: nothing changes, and it says so.
  jax.devices()
  before = os.sched_getaffinity(0)
  assert xla_setup.run_xla_on_one_cpu_core() is False
  assert os.sched_getaffinity(0) == before


_SPLIT_SEEDS_SCRIPT = """
import json, sys
import jax
import numpy as np
from acme_jax_dqn import checkpointing
from agents.dqn.config import DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment
config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100, num_envs=2,
                   samples_per_insert=4.0, epsilon_decay_steps=500)
out = {}
for name, seed, num_seeds in (("pair", 0, 2), ("alone", 1, 1)):
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", seed=seed,
                                num_seeds=num_seeds, total_steps=600, eval_episodes=2,
                                logdir=sys.argv[1] + "/" + name, quiet=True, loggers=("csv",))
  summary = run_experiment(experiment, config)
  params, _, _ = checkpointing.Checkpointer(sys.argv[1] + "/" + name + "/checkpoints"
                                            ).restore_params()
  out[name] = {"seed_devices": summary["seed_devices"],
               "params": [np.asarray(x).tolist() for x in jax.tree.leaves(params)]}
from agents.dqn.seed_layout import seed_mesh as _seed_mesh
out["mesh_sizes"] = [_seed_mesh(*args).size for args in
                     ((2, 0, "mlp"), (2, 0, "minatar_conv"), (3, 0, "mlp"), (4, 1, "mlp"),
                      (4, 2, "nature_conv"), (2, 0, "mlp", None, True), (2, 1, "mlp", 2))]
print(json.dumps({"devices": len(jax.devices()), **out}))
"""


def test_seeds_split_over_cpu_devices_keep_each_seed_its_own(tmp_path):
  """--cpu_devices (0: one per seed for MLPs) runs each block of seeds as its own program:
  seed 1 of a pair split over two devices trains what seed 1 trains alone (to float rounding:
  the split program is compiled apart), and its checkpoint saves and reads back."""
  result = subprocess.run([sys.executable, "-c", _SPLIT_SEEDS_SCRIPT, str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})  # CPU devices, also on a GPU host.
  assert result.returncode == 0, result.stderr[-2000:]
  out = json.loads(result.stdout.splitlines()[-1])
  assert out["devices"] == 2  # Made by the first run (2 seeds), before the CPU client existed.
  pair, alone = out["pair"], out["alone"]
  assert pair["seed_devices"] == 2 and alone["seed_devices"] == 1
  # Auto: every device for MLP torsos, one for conv torsos or under --one_cpu_core; never
  # an uneven split; a resume keeps its checkpoint's split.
  assert out["mesh_sizes"] == [2, 1, 1, 1, 2, 1, 2]
  for in_pair, by_itself in zip(pair["params"], alone["params"]):
    in_pair, by_itself = np.asarray(in_pair), np.asarray(by_itself)
    np.testing.assert_allclose(in_pair[1], by_itself[0], rtol=1e-4, atol=1e-6)
    assert np.max(np.abs(in_pair[0] - in_pair[1])) > 1e-3  # Seed 0 is another run.


_GYMNAX_IMPORT_SCRIPT = """
import sys
import matplotlib
from acme_jax_dqn.envs import gymnax_adapter
gymnax_adapter.make_gymnax("CartPole-v1")
loaded = [name for name in gymnax_adapter.RENDER_ONLY_MODULES if name in sys.modules]
from gymnax.environments.misc import pong
palette = pong.sns.color_palette()  # The stand-in imports seaborn on first use.
import seaborn
import matplotlib.pyplot as plt
print(loaded, type(seaborn).__name__ == "module" and "color_palette" in vars(seaborn),
      len(palette) > 0, pong.plt.figure is plt.figure)
"""


def test_gymnax_imports_without_its_render_only_modules_which_still_work_on_use():
  result = subprocess.run([sys.executable, "-c", _GYMNAX_IMPORT_SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split("\n")[-2] == "[] True True True", result.stdout


def test_anakin_clips_each_reward_before_the_n_step_sum_and_logs_unclipped_returns():
  """CartPole pays 1 a step; with --reward_clip=0.25 every stored 3-step reward is
  0.25 * (1 + g + g^2) cut at the episode end, while episode returns stay whole numbers."""
  config = _tiny_config(n_step=3, reward_clip=0.25, min_replay_size=10_000, discount=0.9)
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
  state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
  state, metrics = jax.jit(trainer.train_chunk, static_argnums=2)(state, 0, 200)
  size = int(_stored_count(state.buffer))
  stored = replay_lib.item_codec(builder.example_transition(env.spec)).decode(
      state.buffer.experience)
  rewards = np.asarray(stored.reward)[0, :size]
  allowed = [0.25, 0.25 * 1.9, 0.25 * (1 + 0.9 + 0.81)]  # Windows of 1, 2 and 3 steps.
  assert size == 800 and np.all(np.min(np.abs(rewards[:, None] - allowed), axis=1) < 1e-6)
  assert np.any(np.abs(rewards - allowed[2]) < 1e-6)
  episodes = float(metrics["episodes"])
  assert episodes > 0 and float(metrics["episode_return_sum"]) / episodes > 5  # Unclipped.


def test_packed_replay_items_train_the_same_run_and_a_resume_reads_unpacked_checkpoints(
    tmp_path, monkeypatch):
  """The run's replay stores items packed (acme_jax_dqn.replay.PackedItems); with them stored
  a leaf per field it trains the same parameters, and a checkpoint in that layout resumes
  into packed storage and finishes the same run."""
  import shutil  # pylint: disable=import-outside-toplevel
  make_anakin = DQNBuilder.make_anakin

  def run(name, packed, resume=False):
    monkeypatch.setattr(DQNBuilder, "make_anakin",
                        functools.partialmethod(make_anakin, packed_items=packed))
    experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                                  total_steps=1200, log_every=400, checkpoint_every=400,
                                  eval_episodes=2, quiet=True, logdir=str(tmp_path / name),
                                  resume=resume)
    return run_experiment(experiment, _tiny_config(num_envs=2, min_replay_size=200, n_step=2,
                                                   prioritized=True))

  packed, unpacked = run("packed", True), run("unpacked", False)
  assert packed["params_checksum"] == unpacked["params_checksum"]
  saved = sorted(int(d) for d in os.listdir(tmp_path / "unpacked" / "checkpoints"))
  shutil.rmtree(tmp_path / "unpacked" / "checkpoints" / str(saved[-1]))
  resumed = run("unpacked", True, resume=True)
  assert resumed["resumed_from_step"] == saved[-2]
  assert resumed["params_checksum"] == packed["params_checksum"]
  assert resumed["eval_return_per_seed"] == packed["eval_return_per_seed"]


def test_a_resume_reads_its_checkpoint_before_anything_compiles_and_runs_no_init(
    tmp_path, monkeypatch):
  """A resumed run reads its checkpoint into the shapes of the state before it compiles: with
  every checkpoint damaged it is refused (each set aside) before any program compiles; from a
  readable one it compiles no init program and finishes as the uninterrupted run."""
  import shutil  # pylint: disable=import-outside-toplevel
  config = _tiny_config(num_envs=2, min_replay_size=200)

  def experiment(name, resume=False):
    return ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                            total_steps=1200, log_every=400, checkpoint_every=400,
                            eval_episodes=2, quiet=True, logdir=str(tmp_path / name),
                            resume=resume)
  full = run_experiment(experiment("full"), config)
  for name in ("damaged", "cut"):
    shutil.copytree(tmp_path / "full", tmp_path / name)
  saved = sorted(int(d) for d in os.listdir(tmp_path / "cut" / "checkpoints"))
  shutil.rmtree(tmp_path / "cut" / "checkpoints" / str(saved[-1]))
  damage_checkpoints(tmp_path / "damaged" / "checkpoints")
  compiled = []  # The arguments of each program compiled.
  original = jax.stages.Lowered.compile

  def compile_and_note(lowered, *args, **kwargs):
    compiled.append(len(lowered.in_tree.children()[0].children()))
    return original(lowered, *args, **kwargs)
  monkeypatch.setattr(jax.stages.Lowered, "compile", compile_and_note)
  with pytest.raises(checkpointing.CheckpointError, match="No readable checkpoint"):
    run_experiment(experiment("damaged", resume=True), config)
  assert not compiled
  set_aside = os.listdir(tmp_path / "damaged" / "checkpoints")
  assert sorted(int(d.split("-")[1]) for d in set_aside) == saved  # None deleted.
  resumed = run_experiment(experiment("cut", resume=True), config)
  assert resumed["resumed_from_step"] == saved[-2]
  assert 1 not in compiled and 2 in compiled  # No init (its keys); the chunk (state, index).
  assert resumed["params_checksum"] == full["params_checksum"]
  assert "checkpoint_read" in resumed["compile_phases_s"]
  assert "init_compiled" not in resumed["compile_phases_s"]


def _stored_count(buffer_state):
  return jnp.where(buffer_state.is_full, buffer_state.experience.observation.shape[1],
                   buffer_state.current_index)


_SEED_LAYOUT_SCRIPT = """
import functools, json, sys
from acme_jax_dqn import xla_setup
xla_setup.set_cpu_devices(5)
import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from acme_jax_dqn import envs
from agents.dqn.seed_layout import over_seeds as _over_seeds, per_device as _per_device
from agents.dqn import seed_layout
from agents.dqn.builder import DQNBuilder
from agents.dqn.config import DQNConfig

config = DQNConfig(hidden_sizes=(32, 32), batch_size=32, num_sgd_steps_per_step=2,
                   samples_per_insert=64.0, min_replay_size=100, replay_capacity=2000,
                   target_update_period=1, target_update_tau=0.01, epsilon_decay_steps=500)
env = envs.make_jax_environment("gymnax:CartPole-v1")
builder = DQNBuilder(config)
trainer = builder.make_anakin(env, builder.make_networks(env.spec), eval_episodes=2)
compiled = {}

def train(seeds, devices):
  if (len(seeds), devices) not in compiled:
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:devices]), ("seeds",))
    batched = len(seeds) > devices  # One seed per device runs unbatched, more are vmapped.
    init = _per_device(_over_seeds(trainer.init, batched), mesh, P("seeds"))
    chunk = _per_device(_over_seeds(functools.partial(trainer.train_chunk, num_iterations=300),
                                    batched, in_axes=(0, None)), mesh, (P("seeds"), P()))
    compiled[(len(seeds), devices)] = jax.jit(lambda keys: chunk(init(keys), np.int32(0)))
  keys = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
  state, metrics = compiled[(len(seeds), devices)](keys)
  leaves = jax.tree.leaves(jax.device_get(state.learner.online_params))
  return [np.concatenate([np.ravel(x[i]) for x in leaves]) for i in range(len(seeds))], metrics

alone = {s: train([s], 1)[0][0] for s in range(5)}
out = {"learner_steps": int(train([0], 1)[1]["learner_steps"][0]), "layouts": {}}
for num_seeds, devices in ((2, 1), (2, 2), (5, 1), (5, 5)):
  params, _ = train(list(range(num_seeds)), devices)
  out["layouts"][f"{num_seeds}x{devices}"] = [
      float(np.max(np.abs(params[k] - alone[k]))) for k in range(num_seeds)]
out["apart"] = float(np.max(np.abs(alone[0] - alone[1])))
print(json.dumps(out))
"""


def test_seed_k_in_a_k_seed_program_trains_what_it_trains_alone():
  """Seeds in one vmapped program, on one device or split, are not coupled: after a few
  hundred learner steps seed k's parameters equal seed k's alone (one seed on its device,
  which runs unbatched) to float rounding."""
  result = subprocess.run([sys.executable, "-c", _SEED_LAYOUT_SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  out = json.loads(result.stdout.splitlines()[-1])
  assert out["learner_steps"] >= 300
  assert set(out["layouts"]) == {"2x1", "2x2", "5x1", "5x5"}
  for layout, diffs in out["layouts"].items():
    assert max(diffs) < 1e-4, (layout, diffs)
  assert out["apart"] > 1e-2  # Different seeds train different parameters.


def _one_gib_of_memory(monkeypatch):
  """Every device and the host hold 1 GiB: the checks below do not depend on this machine."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 2**30)


def test_seeds_whose_state_cannot_fit_in_memory_are_refused_before_compiling(tmp_path,
                                                                             monkeypatch):
  _one_gib_of_memory(monkeypatch)
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                                total_steps=400, logdir=str(tmp_path / "run"), quiet=True,
                                loggers=("csv",))
  with pytest.raises(ConfigError, match=r"`num_seeds`=2: the training state needs [\d,.]+ GiB "
                     r"of host memory \([\d,.]+ MiB per seed: replay \(`replay_capacity`="
                     r"100000000\) [\d,.]+, learner .*Not one seed fits: use a smaller "
                     r"`replay_capacity`\.$"):
    run_experiment(experiment, _tiny_config(replay_capacity=10**8))
  assert not (tmp_path / "run" / "train.csv").exists()


NETWORK_FIX = ("a smaller network (`hidden_sizes`, `torso`, `iqn_num_cosines`) or fewer "
               "outputs per action (`num_atoms`, `num_quantiles`)")


@pytest.mark.parametrize("config_fields, experiment_fields, fix", [
    ({"hidden_sizes": (20_000, 20_000)}, {}, NETWORK_FIX),
    ({"hidden_sizes": (20_000, 20_000), "pqn": True}, {}, NETWORK_FIX),  # PQN: no replay.
    ({}, {"eval_episodes": 10**8}, "fewer `eval_episodes`"),
    ({"n_step": 10**7}, {"total_steps": 10**9}, "a smaller `n_step` or fewer `num_envs`"),
    ({"num_envs": 5 * 10**7, "replay_capacity": 5 * 10**7}, {"total_steps": 10**9},
     "fewer `num_envs`"),
])
def test_seeds_that_cannot_fit_are_told_the_fix_for_the_largest_part(
    tmp_path, monkeypatch, config_fields, experiment_fields, fix):
  """The parameters, the evaluation's episodes in flight or the environments, not the replay."""
  _one_gib_of_memory(monkeypatch)
  experiment = ExperimentConfig(**{
      "env": "gymnax:CartPole-v1", "run_mode": "anakin", "total_steps": 400,
      "logdir": str(tmp_path / "run"), "quiet": True, "loggers": ("csv",),
      **experiment_fields})
  with pytest.raises(ConfigError) as error:
    run_experiment(experiment, _tiny_config(**{"min_replay_size": 50, **config_fields}))
  assert str(error.value).endswith(f"Not one seed fits: use {fix}."), str(error.value)
  assert not (tmp_path / "run" / "train.csv").exists()


def test_a_program_whose_working_memory_cannot_fit_is_refused_before_it_runs(tmp_path,
                                                                             monkeypatch):
  """PQN's state is small; its rollout and the activations over it are the program's temporaries."""
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 4 * 2**20)
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                                total_steps=8192, eval_episodes=2, logdir=str(tmp_path / "run"),
                                quiet=True, loggers=("csv",))
  config = _tiny_config(pqn=True, num_envs=64, pqn_rollout_len=64, pqn_minibatches=2,
                        hidden_sizes=(128, 128))
  with pytest.raises(ConfigError, match=r"`num_seeds`=2: the compiled training chunk needs "
                     r"[\d.]+ GiB of host memory \([\d,.]+ MiB per seed, [\d,.]+ MiB of it "
                     r"working memory\) .* Not one seed fits: use a shorter `pqn_rollout_len` "
                     r"or fewer `num_envs`\.$"):
    run_experiment(experiment, config)
  assert not (tmp_path / "run" / "train.csv").exists()


def test_program_memory_counts_a_devices_share_per_seed_and_names_the_seeds_that_fit(
    monkeypatch):
  """A device's share of 100 MiB (70 of it temporaries) for its two seeds, worked by hand."""
  mib = 2**20
  stats = types.SimpleNamespace(argument_size_in_bytes=30 * mib, output_size_in_bytes=30 * mib,
                                alias_size_in_bytes=30 * mib, temp_size_in_bytes=70 * mib)
  compiled = types.SimpleNamespace(memory_analysis=lambda: stats)
  mesh = lambda platform: types.SimpleNamespace(
      devices=np.array([types.SimpleNamespace(platform=platform)] * 2), size=2)
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 150 * mib)
  # Two CPU devices share the host: 200 MiB, 50 per seed; 0.9 x 150 MiB holds 2 seeds.
  with pytest.raises(ConfigError, match=r"^`num_seeds`=4: the compiled training chunk needs "
                     r"0\.2 GiB of host memory \(50\.0 MiB per seed, 35\.0 MiB of it working "
                     r"memory\) and the host holds 0\.1 GiB\. Use `num_seeds` <= 2, or a "
                     r"smaller `batch_size`\.$"):
    seed_layout.check_program_memory(compiled, mesh("cpu"), 4, DQNConfig(), "training chunk")
  # Two GPUs each hold their 2 seeds: 100 MiB fits in 0.9 x 150, not in 0.9 x 100.
  seed_layout.check_program_memory(compiled, mesh("gpu"), 4, DQNConfig(), "training chunk")
  monkeypatch.setattr(xla_setup, "device_memory_bytes", lambda device: 100 * mib)
  with pytest.raises(ConfigError, match=r"needs 0\.1 GiB per device .* a device holds 0\.1 GiB\. "
                     r"Use `num_seeds` <= 2, or fewer `eval_episodes`\.$"):
    seed_layout.check_program_memory(compiled, mesh("gpu"), 4, DQNConfig(), "evaluation")


def test_memory_analysis_gives_one_devices_share_of_a_program_over_devices():
  """What check_program_memory assumes: per device, not the sum over devices (fresh process:
  two CPU devices)."""
  script = """
import json
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_num_cpu_devices", 2)
from jax.sharding import PartitionSpec as P
from agents.dqn import seed_layout
def temp(n):  # One seed per device; each seed's outer product (4 MB) is a dot's operand.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("seeds",))
  f = seed_layout.per_device(jax.vmap(lambda x: jnp.outer(x, x) @ x), mesh, P("seeds"))
  compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((n, 1000), jnp.float32)).compile()
  return compiled.memory_analysis().temp_size_in_bytes
print(json.dumps([temp(1), temp(2)]))
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  one, two = json.loads(result.stdout.strip().splitlines()[-1])
  assert one == two >= 4 * 10**6


def test_too_many_seeds_are_refused_before_any_per_seed_work(tmp_path, monkeypatch):
  """Ten million seeds: the memory check needs only the keys' shape, so no key is made first."""
  def no_keys(seeds):
    raise AssertionError(f"keys made for {len(seeds)} seeds before the memory check")
  monkeypatch.setattr(dqn_anakin.seeding, "keys_of", no_keys)
  _one_gib_of_memory(monkeypatch)
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=10**7,
                                total_steps=400, logdir=str(tmp_path / "run"), quiet=True,
                                loggers=("csv",))
  with pytest.raises(ConfigError, match=r"`num_seeds`=10000000: the training state needs "
                     r"[\d,.]+ GiB of host memory .*Use `num_seeds` <= \d+"):
    run_experiment(experiment, _tiny_config())
  assert not (tmp_path / "run" / "train.csv").exists()


def test_jax_batches_rbg_bits_from_the_first_key_so_such_seeds_are_refused(tmp_path):
  """The JAX behaviour the check guards against, and the check, before any compile."""
  for impl, independent in (("threefry2x32", True), ("unsafe_rbg", False), ("rbg", False)):
    with xla_setup.prng_impl(impl):
      keys = jnp.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)])
      batched = jax.vmap(lambda k: jax.random.uniform(k, (4,)))(keys)
      alone = jax.random.uniform(jax.random.PRNGKey(1), (4,))
      assert np.allclose(batched[1], alone) == independent, impl
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", num_seeds=2,
                                cpu_devices=1, prng_impl="unsafe_rbg", total_steps=400,
                                logdir=str(tmp_path / "run"), quiet=True, loggers=("csv",))
  with pytest.raises(ConfigError, match="`prng_impl`=unsafe_rbg with 2 seeds on one device"):
    run_experiment(experiment, _tiny_config())
  assert not (tmp_path / "run" / "train.csv").exists()


@pytest.mark.parametrize("num_seeds", [1, 2])  # One seed runs unbatched; two are vmapped.
def test_evaluation_i_uses_each_seeds_eval_key_folded_with_i(tmp_path, num_seeds):
  from agents.dqn.anakin import AnakinSource  # pylint: disable=import-outside-toplevel
  experiment = ExperimentConfig(env="gymnax:CartPole-v1", run_mode="anakin", total_steps=1000,
                                logdir=str(tmp_path), eval_episodes=4, quiet=True,
                                num_seeds=num_seeds, save_checkpoints=False,
                                cpu_devices=1)  # Both seeds on one device: vmapped.
  source = AnakinSource(experiment, _tiny_config(num_envs=2, min_replay_size=100))
  try:
    params = source.params()
    evaluate = jax.jit(source._trainer.evaluate)  # pylint: disable=protected-access
    keys = source._eval_keys  # pylint: disable=protected-access
    want = {i: np.stack([evaluate(jax.tree.map(lambda x, s=s: x[s], params),
                                  jax.random.fold_in(keys[s], i)) for s in range(num_seeds)])
            for i in (0, 3)}  # Per seed, the return of each evaluation episode.
    assert not np.array_equal(want[0], want[3])  # The index changes the episodes.
    for i in (0, 3):
      source.start_eval(i)
      np.testing.assert_allclose(source.evals[-1][2], want[i], rtol=1e-6)
  finally:
    source.close()
