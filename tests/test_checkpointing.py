"""Checkpoints in-process: orbax saves, keep-N, cut-off and corrupt saves, layout errors, checksums, the NaN guard, CSV resume."""

import glob
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from acme_jax_dqn import checkpointing
from acme_jax_dqn import loggers
from acme_jax_dqn import replay as replay_lib
from acme_jax_dqn import specs
from acme_jax_dqn.types import Transition
from agents.dqn import DQNBuilder, DQNConfig
from tests.fakes import FakeEnvironment


def _state(scale=1.0):
  replay = replay_lib.make_replay(64, 8, prioritized=True)
  example = Transition(np.zeros(3, np.float32), np.int32(0), np.float32(0),
                       np.float32(0), np.zeros(3, np.float32))
  return {"buffer": replay.init(example), "w": jnp.arange(4.0) * scale,
          "key": jax.random.PRNGKey(3)}


def _corrupt_data_files(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
           if os.path.isfile(f)]
  assert files
  for f in files:
    with open(f, "wb") as out:
      out.write(b"cut")


def test_save_restore_round_trip_and_keep_n(tmp_path):
  checkpointer = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2)
  for step in (10, 20, 30, 40):
    checkpointer.save(step, _state(step), {"note": step}, host={"step": step},
                      params={"w": jnp.full(2, step, jnp.float32)})
  assert checkpointer.steps() == [30, 40]
  assert sorted(os.listdir(tmp_path)) == ["30", "40"]  # Exactly two left.
  restored, meta, host, step = checkpointer.restore(_state())
  assert step == 40 and meta["note"] == 40 and host == {"step": 40}
  np.testing.assert_array_equal(restored["w"], np.arange(4.0) * 40)
  assert type(restored["buffer"]) is type(_state()["buffer"])
  params, _, _ = checkpointer.restore_params(30)
  np.testing.assert_array_equal(params["w"], [30.0, 30.0])
  with pytest.raises(checkpointing.CheckpointError, match="already exists"):
    checkpointer.save(40, _state(), {}, host=None)  # Never overwritten.
  checkpointer.close()


def test_cut_off_save_in_a_temporary_directory_is_not_taken_as_latest(tmp_path):
  checkpointer = checkpointing.Checkpointer(str(tmp_path))
  checkpointer.save(10, _state(10), {}, host=None)
  checkpointer.save(20, _state(20), {}, host=None)
  # What orbax leaves when a save is cut off: a temporary directory, never renamed.
  shutil.copytree(tmp_path / "20", tmp_path / "30.orbax-checkpoint-tmp-1234")
  for marker in glob.glob(str(tmp_path / "30.orbax-checkpoint-tmp-1234" / "**" /
                              "commit_success.txt"), recursive=True):
    os.remove(marker)
  fresh = checkpointing.Checkpointer(str(tmp_path))
  assert fresh.steps() == [10, 20]
  _, _, _, step = fresh.restore(_state())
  assert step == 20
  fresh.close()


def test_truncated_checkpoint_is_skipped_for_the_previous_one_and_kept_aside(tmp_path, capsys):
  checkpointer = checkpointing.Checkpointer(str(tmp_path))
  checkpointer.save(10, _state(10), {}, host="ten")
  checkpointer.save(20, _state(20), {}, host="twenty")
  _corrupt_data_files(str(tmp_path / "20"))
  restored, _, host, step = checkpointing.Checkpointer(str(tmp_path)).restore(_state())
  assert step == 10 and host == "ten"
  np.testing.assert_array_equal(restored["w"], np.arange(4.0) * 10)
  assert "unreadable" in capsys.readouterr().err
  moved = [d for d in os.listdir(tmp_path) if d.startswith("corrupt-20-")]
  assert len(moved) == 1  # Kept for inspection, out of the way of new saves.


def test_a_checkpoint_this_code_cannot_load_is_left_in_place(tmp_path, monkeypatch):
  module_dir = tmp_path / "mods"
  module_dir.mkdir()
  (module_dir / "gone_module.py").write_text("class Thing:\n  pass\n")
  monkeypatch.syspath_prepend(str(module_dir))
  import gone_module  # pylint: disable=import-outside-toplevel,import-error
  checkpointer = checkpointing.Checkpointer(str(tmp_path / "ck"))
  checkpointer.save(10, _state(), {}, host=gone_module.Thing())
  checkpointer.close()
  (module_dir / "gone_module.py").unlink()
  monkeypatch.delitem(sys.modules, "gone_module")
  with pytest.raises(checkpointing.CheckpointError, match="cannot be loaded by this code"):
    checkpointing.Checkpointer(str(tmp_path / "ck")).restore(_state())
  assert os.listdir(tmp_path / "ck") == ["10"]  # Not set aside: the data is fine.


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(checkpointing.CheckpointError, match="no checkpoint"):
    checkpointing.Checkpointer(str(tmp_path / "empty")).restore(_state())
  checkpointer = checkpointing.Checkpointer(str(tmp_path / "bad"))
  checkpointer.save(10, _state(), {}, host=None)
  _corrupt_data_files(str(tmp_path / "bad" / "10"))
  with pytest.raises(checkpointing.CheckpointError, match="No readable checkpoint"):
    checkpointing.Checkpointer(str(tmp_path / "bad")).restore(_state())


def test_late_closed_loop_errors_of_a_failed_restore_are_dropped_and_others_kept(monkeypatch):
  import threading  # pylint: disable=import-outside-toplevel
  import types  # pylint: disable=import-outside-toplevel
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(("unraisable", str(u.exc_value))))
  monkeypatch.setattr(threading, "excepthook", lambda a: seen.append(("thread", str(a.exc_value))))
  monkeypatch.setattr(sys, "excepthook", lambda t, v, tb: seen.append(("except", str(v))))
  checkpointing._quiet_closed_loop_callbacks()
  hooks = (sys.unraisablehook, threading.excepthook, sys.excepthook)
  checkpointing._quiet_closed_loop_callbacks()  # Twice: the hooks are not stacked.
  assert (sys.unraisablehook, threading.excepthook, sys.excepthook) == hooks
  closed, other = RuntimeError("Event loop is closed"), RuntimeError("disk full")

  def late_callbacks():  # As tensorstore's threads report them.
    for error in (closed, other):
      sys.unraisablehook(types.SimpleNamespace(exc_value=error))
      threading.excepthook(types.SimpleNamespace(exc_value=error))
      sys.excepthook(RuntimeError, error, None)

  thread = threading.Thread(target=late_callbacks)
  thread.start()
  thread.join()
  assert seen == [("unraisable", "disk full"), ("thread", "disk full"), ("except", "disk full")]
  # The main thread's own uncaught error always prints, whatever it says.
  sys.excepthook(RuntimeError, closed, None)
  assert seen[-1] == ("except", "Event loop is closed")


def test_never_retrieved_orbax_read_errors_are_dropped_from_the_asyncio_log_and_others_kept():
  import logging  # pylint: disable=import-outside-toplevel
  checkpointing._quiet_closed_loop_callbacks()
  log_filter = [f for f in logging.getLogger("asyncio").filters
                if getattr(f, "_drops_orbax_read_errors", False)]
  assert len(log_filter) == 1

  def record(message, filename):
    code = compile("raise ValueError('OUT_OF_RANGE')", filename, "exec")
    try:
      exec(code)  # pylint: disable=exec-used
    except ValueError as error:
      exc_info = (ValueError, error, error.__traceback__)
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, exc_info)

  orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py")
  assert not log_filter[0].filter(record("Task exception was never retrieved\nfuture: x",
                                         orbax_file))
  assert log_filter[0].filter(record("Task exception was never retrieved\nfuture: x",
                                     os.path.join(os.sep, "app", "mine.py")))
  assert log_filter[0].filter(record("Unhandled exception in event loop", orbax_file))


def test_layout_mismatch_names_the_leaf_and_the_explanation(tmp_path):
  checkpointer = checkpointing.Checkpointer(str(tmp_path))
  checkpointer.save(10, {"w": jnp.zeros((4, 2))}, {}, host=None)
  with pytest.raises(checkpointing.CheckpointError) as error:
    checkpointer.restore({"w": jnp.zeros((4, 3))}, explain=lambda meta: " Flags: --x=3.")
  message = str(error.value)
  assert "['w']" in message and "(4, 2)" in message and "(4, 3)" in message
  assert "--x=3" in message


def test_differing_fields_names_flags_with_both_values():
  out = checkpointing.differing_fields({"hidden_sizes": [64, 64], "lr": 1.0},
                                       {"hidden_sizes": (32,), "lr": 1.0})
  assert out == ["--hidden_sizes=32 (checkpoint: 64,64)"]


def test_params_checksum_is_equal_for_equal_params_and_sensitive_to_one_ulp():
  params = {"layer": {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
                      "b": np.zeros(4, np.float32)}}
  same = jax.tree.map(lambda x: jnp.asarray(x.copy()), params)
  assert checkpointing.params_checksum(params) == checkpointing.params_checksum(same)
  nudged = jax.tree.map(np.copy, params)
  nudged["layer"]["w"][1, 2] = np.nextafter(nudged["layer"]["w"][1, 2], np.float32(2))
  assert checkpointing.params_checksum(params) != checkpointing.params_checksum(nudged)


def _builder_pieces(config):
  spec = specs.make_environment_spec(FakeEnvironment(obs_dim=3, num_actions=2))
  builder = DQNBuilder(config)
  networks = builder.make_networks(spec)
  replay = builder.make_replay()
  sgd_step = jax.jit(builder.make_sgd_step(networks))
  from acme_jax_dqn import learning  # pylint: disable=import-outside-toplevel
  state = learning.init_training_state(networks, builder.make_optimizer(),
                                       jax.random.PRNGKey(0))
  return spec, replay, sgd_step, state


def _batch(reward_value, batch_size=4):
  rng = np.random.default_rng(0)
  transitions = Transition(
      observation=rng.normal(size=(batch_size, 3)).astype(np.float32),
      action=np.arange(batch_size, dtype=np.int32) % 2,
      reward=np.full(batch_size, 1.0, np.float32),
      discount=np.full(batch_size, 0.99, np.float32),
      next_observation=rng.normal(size=(batch_size, 3)).astype(np.float32))
  transitions = transitions._replace(reward=transitions.reward.copy())
  transitions.reward[1] = reward_value
  ones = np.ones(batch_size, np.float32)
  return replay_lib.ReplaySample(transitions, np.arange(batch_size, dtype=np.int32), ones, ones)


def test_nonfinite_update_is_not_applied_but_counted():
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, target_update_period=1,
                     target_update_tau=0.5)
  _, _, sgd_step, state = _builder_pieces(config)
  bad_state, metrics = sgd_step(state, _batch(np.nan))
  assert not np.isfinite(float(metrics["loss"]))
  for new, old in zip(jax.tree.leaves((bad_state.online_params, bad_state.target_params,
                                       bad_state.opt_state)),
                      jax.tree.leaves((state.online_params, state.target_params,
                                       state.opt_state))):
    np.testing.assert_array_equal(new, old)
  assert int(bad_state.steps) == 1
  assert int(bad_state.nonfinite_updates) == 1 and int(bad_state.first_nonfinite_step) == 1
  good_state, metrics = sgd_step(bad_state, _batch(1.0))
  assert np.isfinite(float(metrics["loss"]))
  changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                         good_state.online_params, state.online_params)
  assert any(jax.tree.leaves(changed))
  assert int(good_state.nonfinite_updates) == 1 and int(good_state.first_nonfinite_step) == 1
  inf_state, _ = sgd_step(good_state, _batch(np.inf))
  assert int(inf_state.nonfinite_updates) == 2 and int(inf_state.first_nonfinite_step) == 1


def test_nonfinite_items_get_priority_zero_in_prioritized_replay():
  config = DQNConfig(hidden_sizes=(8,), batch_size=4, prioritized=True, replay_capacity=4,
                     min_replay_size=4)
  spec, replay, _, state = _builder_pieces(config)
  builder = DQNBuilder(config)
  learner_step = jax.jit(builder.make_learner_step(builder.make_networks(spec), replay))
  batch = _batch(np.nan).transitions
  buffer = replay.add(replay.init(jax.tree.map(lambda x: x[0], batch)), batch)
  from flashbax.buffers import sum_tree  # pylint: disable=import-outside-toplevel
  for _ in range(30):  # Until the NaN item (index 1) has been drawn once.
    state, buffer, _ = learner_step(state, buffer)
    if int(state.nonfinite_updates):
      break
  assert int(state.nonfinite_updates) == 1
  priorities = np.asarray(sum_tree.get(buffer.sum_tree_state, jnp.arange(4)))
  assert priorities[1] == 0.0 and np.all(priorities[[0, 2, 3]] > 0)
  for _ in range(30):  # Priority 0: never drawn again, so no more skipped updates.
    state, buffer, _ = learner_step(state, buffer)
  assert int(state.nonfinite_updates) == 1


def test_csv_logger_resume_drops_rows_after_the_checkpoint_and_appends(tmp_path):
  path = str(tmp_path / "train.csv")
  logger = loggers.CSVLogger(path)
  for step in (100, 200, 300):
    logger.write({"env_steps": step, "loss": step / 100})
  logger.close()
  resumed = loggers.CSVLogger(path, keep_rows_up_to=200)
  resumed.write({"env_steps": 300, "loss": 9.0, "new_column": 1})
  resumed.close()
  lines = open(path).read().strip().splitlines()
  assert lines == ["env_steps,loss", "100,1.0", "200,2.0", "300,9.0"]


_TINY = dict(hidden_sizes=(16,), batch_size=16, min_replay_size=200, replay_capacity=1000,
             samples_per_insert=4.0)
_DECAYING = dict(learning_rate_schedule="linear", learning_rate_decay_steps=1000)
# (saved flags, resumed flags, the flags a resume refuses): every change that keeps the
# saved state's layout is allowed, every one that changes it is refused.
STRUCTURE_CASES = [
    ({}, {"learning_rate": 5e-4}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_end": 1e-5}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_decay_steps": 500}, []),
    (_DECAYING, {**_DECAYING, "learning_rate_schedule": "cosine"}, []),
    ({}, {"learning_rate_schedule": "linear"}, []),  # No decay steps: still constant.
    ({}, {"epsilon_start": 0.5, "epsilon_end": 0.1, "epsilon_decay_steps": 100}, []),
    ({}, {"target_update_tau": 0.5, "target_update_period": 10}, []),
    ({}, {"max_grad_norm": 5.0}, []),
    ({}, {"batch_size": 32, "num_sgd_steps_per_step": 2, "samples_per_insert": 8.0}, []),
    ({}, {"discount": 0.9, "double_q": True, "huber_delta": 0.0, "reward_clip": 1.0}, []),
    ({}, {"num_atoms": 11}, []),  # No C51 head: the atoms are not in the state.
    ({"distributional": True}, {"distributional": True, "v_min": -5.0}, []),
    ({"prioritized": True}, {"prioritized": True, "priority_exponent": 0.5,
                             "importance_sampling_anneal_steps": 100}, []),
    ({}, {"hidden_sizes": (32,)}, ["hidden_sizes"]),
    ({}, {"dueling": True}, ["dueling"]),
    ({}, {"distributional": True}, ["distributional"]),
    ({"distributional": True}, {"distributional": True, "num_atoms": 11}, ["num_atoms"]),
    ({}, {"replay_capacity": 2000}, ["replay_capacity"]),
    ({}, {"prioritized": True}, ["prioritized"]),
    ({}, {"max_grad_norm": 0.0}, ["max_grad_norm"]),
    ({}, _DECAYING, ["learning_rate_decay_steps", "learning_rate_schedule"]),
    ({"learning_rate_schedule": "cosine"}, {"learning_rate_schedule": "cosine",
                                            "learning_rate_decay_steps": 1000},
     ["learning_rate_decay_steps"]),
    ({}, {"gradient_accumulation_steps": 2}, ["gradient_accumulation_steps"]),
]


def _anakin_layout(config):
  from acme_jax_dqn import envs  # pylint: disable=import-outside-toplevel
  env = envs.make_jax_environment("gymnax:CartPole-v1")
  builder = DQNBuilder(config)
  trainer = builder.make_anakin(env, builder.make_networks(env.spec, "gymnax:CartPole-v1"), 2)
  return checkpointing.tree_layout(jax.eval_shape(trainer.init, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("saved, resumed, refused", STRUCTURE_CASES)
def test_resume_refuses_exactly_the_flag_changes_that_change_the_saved_state(saved, resumed,
                                                                              refused):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  saved_config, config = DQNConfig(**{**_TINY, **saved}), DQNConfig(**{**_TINY, **resumed})
  assert checkpoints.structure_differences(dataclasses.asdict(saved_config),
                                           dataclasses.asdict(config)) == refused
  difference = checkpointing.first_layout_difference(_anakin_layout(saved_config),
                                                     _anakin_layout(config))
  assert (difference is not None) == bool(refused), difference


def test_gradient_accumulation_steps_never_change_on_resume():
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  # Same layout, but the accumulated gradients and the update counts are of k steps.
  two, three = (dataclasses.asdict(DQNConfig(gradient_accumulation_steps=k)) for k in (2, 3))
  assert checkpoints.structure_differences(two, three) == ["gradient_accumulation_steps"]


def test_check_same_run_warns_on_schedules_and_refuses_another_run_or_state(tmp_path):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from agents.dqn import checkpoints  # pylint: disable=import-outside-toplevel
  from agents.dqn.experiment import ExperimentConfig  # pylint: disable=import-outside-toplevel
  experiment = ExperimentConfig(logdir=str(tmp_path), resume=True)
  saved = DQNConfig(**_TINY)
  meta = {"experiment": dataclasses.asdict(experiment), "config": dataclasses.asdict(saved),
          "replay_saved": True}
  meta = {**meta, "config": {**meta["config"], "hidden_sizes": [16]}}  # As JSON holds it.

  def check(config, experiment=experiment, meta=meta):
    checkpoints.RunCheckpoints(experiment, config).check_same_run(meta, 400)

  check(dataclasses.replace(saved, learning_rate=5e-4, epsilon_end=0.2, target_update_tau=0.1,
                            learning_rate_end=1e-5))
  check(saved, dataclasses.replace(experiment, total_steps=90_000))
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"another run: --seed=5 \(checkpoint: 0\)"):
    check(saved, dataclasses.replace(experiment, seed=5))
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"another run: --n_step=3 \(checkpoint: 1\)"):
    check(dataclasses.replace(saved, n_step=3))
  with pytest.raises(checkpointing.CheckpointError, match=r"does not fit this run: "
                     r"--hidden_sizes=32 \(checkpoint: 16\); --prioritized=True"):
    check(dataclasses.replace(saved, hidden_sizes=(32,), prioritized=True))
  # A checkpoint without its replay fits another replay.
  check(dataclasses.replace(saved, replay_capacity=5000),
        meta={**meta, "replay_saved": False})
