"""Checkpoints in-process: orbax saves, keep-N, cut-off and corrupt saves, layout errors, checksums, CSV resume."""

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
from acme_jax_dqn.types import Transition


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


def test_a_checkpoint_with_replay_items_unpacked_restores_packed_and_names_other_changes(
    tmp_path):
  example = Transition(np.zeros(3, np.float32), np.int32(0), np.float32(0), np.float32(0),
                       np.zeros(3, np.float32))
  plain = replay_lib.make_replay(64, 8, prioritized=True)
  packed = replay_lib.make_replay(64, 8, prioritized=True, packed_example=example)
  rng = np.random.default_rng(0)
  items = Transition(rng.standard_normal((5, 3)).astype(np.float32), np.arange(5, dtype=np.int32),
                     rng.standard_normal(5).astype(np.float32), np.ones(5, np.float32),
                     rng.standard_normal((5, 3)).astype(np.float32))
  checkpointer = checkpointing.Checkpointer(str(tmp_path))
  checkpointer.save(10, {"buffer": plain.add(plain.init(example), items), "w": jnp.arange(4.0)},
                    {}, host=None)
  codec = replay_lib.item_codec(example)

  def restore(w):
    target = checkpointing.abstract_tree({"buffer": packed.init(example), "w": w})
    return checkpointer.restore(target, earlier=replay_lib.unpacked_layout(target, codec))

  state, _, _, step = restore(jnp.zeros(4))
  assert step == 10 and isinstance(state["buffer"].experience, replay_lib.PackedItems)
  for stored, written in zip(packed.items(state["buffer"]), items):
    np.testing.assert_array_equal(np.asarray(stored)[0, :5], written)
  np.testing.assert_array_equal(state["w"], np.arange(4.0))
  # In neither layout: the error names the leaf that differs, not the packing.
  with pytest.raises(checkpointing.CheckpointError, match=r"leaf \['w'\] has shape \(4,\)"):
    restore(jnp.zeros(5))


def test_differing_fields_names_flags_with_both_values():
  out = checkpointing.differing_fields({"hidden_sizes": [64, 64], "lr": 1.0},
                                       {"hidden_sizes": (32,), "lr": 1.0})
  assert out == ["`hidden_sizes`=32 (checkpoint: 64,64)"]


def test_params_checksum_is_equal_for_equal_params_and_sensitive_to_one_ulp():
  params = {"layer": {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
                      "b": np.zeros(4, np.float32)}}
  same = jax.tree.map(lambda x: jnp.asarray(x.copy()), params)
  assert checkpointing.params_checksum(params) == checkpointing.params_checksum(same)
  nudged = jax.tree.map(np.copy, params)
  nudged["layer"]["w"][1, 2] = np.nextafter(nudged["layer"]["w"][1, 2], np.float32(2))
  assert checkpointing.params_checksum(params) != checkpointing.params_checksum(nudged)


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
