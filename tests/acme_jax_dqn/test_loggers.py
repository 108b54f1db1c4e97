"""Loggers: TensorBoard event files read back by TensorBoard's reader, W&B rows, the progress bar."""

import csv
import io
import os
import subprocess
import sys
import threading

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from acme_jax_dqn import loggers
from agents.dqn import DQNConfig
from agents.dqn.experiment import ExperimentConfig, run_experiment


def _scalars(logdir, tag):
  accumulator = EventAccumulator(str(logdir))
  accumulator.Reload()
  return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_a_run_writes_tensorboard_scalars_that_match_its_csv_rows(tmp_path):
  config = DQNConfig(hidden_sizes=(16,), batch_size=16, min_replay_size=100,
                     replay_capacity=1000, samples_per_insert=4.0, epsilon_decay_steps=300)
  experiment = ExperimentConfig(total_steps=600, logdir=str(tmp_path), log_every=200,
                                eval_every=300, eval_episodes=2, quiet=True,
                                save_checkpoints=False, loggers=("csv", "tensorboard"))
  run_experiment(experiment, config)
  with open(tmp_path / "train.csv") as f:
    train_rows = list(csv.DictReader(f))
  with open(tmp_path / "eval.csv") as f:
    eval_rows = list(csv.DictReader(f))
  losses = _scalars(tmp_path, "train/loss")
  assert [step for step, _ in losses] == [int(r["env_steps"]) for r in train_rows] == [
      200, 400, 600]
  for (_, value), row in zip(losses, train_rows):
    assert value == pytest.approx(float(row["loss"]), rel=1e-4)
  returns = _scalars(tmp_path, "eval/eval_return_mean")
  assert [(s, pytest.approx(v)) for s, v in returns] == [
      (int(r["env_steps"]), float(r["eval_return_mean"])) for r in eval_rows]
  assert len(returns) == 2  # At 300 and at the end.


def test_tensorboard_and_csv_agree_after_a_resume_and_after_a_fresh_rerun(tmp_path):
  """Resumed at 200: rows up to 200 stay, later ones go; a new run in the same logdir starts clean."""

  def log(resumed_from, rows):
    run_log = loggers.RunLoggers(str(tmp_path), ["csv", "tensorboard"], 1000, quiet=True,
                                 resumed_from=resumed_from)
    for step, loss in rows:
      run_log.train({"env_steps": step, "loss": loss})
    run_log.close()

  def csv_rows():
    with open(tmp_path / "train.csv") as f:
      return [(int(r["env_steps"]), float(r["loss"])) for r in csv.DictReader(f)]

  log(None, [(100, 1.0), (200, 1.0), (300, 1.0)])  # Interrupted after its checkpoint at 200.
  log(200, [(300, 2.0), (400, 2.0)])
  expected = [(100, 1.0), (200, 1.0), (300, 2.0), (400, 2.0)]
  assert csv_rows() == expected
  assert _scalars(tmp_path, "train/loss") == expected
  log(None, [(100, 3.0)])  # A new run into the same logdir.
  assert csv_rows() == _scalars(tmp_path, "train/loss") == [(100, 3.0)]


def test_an_evaluation_made_up_by_two_resumes_shows_once_in_tensorboard(tmp_path):
  """A run stopped in its evaluation at 200 (checkpoint 200, evaluation due) is resumed twice
  from that checkpoint (the second extends the first); each makes the evaluation up."""

  def log(resumed_from, train, evals):
    run_log = loggers.RunLoggers(str(tmp_path), ["csv", "tensorboard"], 1000, quiet=True,
                                 resumed_from=resumed_from,
                                 eval_rows_up_to=None if resumed_from is None else 199)
    for step, value in evals:
      run_log.eval({"env_steps": step, "eval_return_mean": value})
    for step, loss in train:
      run_log.train({"env_steps": step, "loss": loss})
    run_log.close()

  log(None, [(100, 1.0), (200, 1.0)], [(100, 10.0)])
  log(200, [], [(200, 20.0)])
  log(200, [(300, 3.0)], [(200, 21.0), (300, 30.0)])
  expected = [(100, 10.0), (200, 21.0), (300, 30.0)]
  assert _scalars(tmp_path, "eval/eval_return_mean") == expected
  with open(tmp_path / "eval.csv") as f:
    assert [(int(r["env_steps"]), float(r["eval_return_mean"]))
            for r in csv.DictReader(f)] == expected
  # The train row at 200, hidden with the evaluation's step, is written again.
  assert _scalars(tmp_path, "train/loss") == [(100, 1.0), (200, 1.0), (300, 3.0)]


class _FakeWandbRun:

  def __init__(self):
    self.logged, self.metrics, self.finished = [], [], False

  def define_metric(self, name, step_metric):
    self.metrics.append((name, step_metric))

  def log(self, values):
    self.logged.append(values)

  def finish(self):
    self.finished = True


class _FakeWandb:

  def __init__(self):
    self.run = _FakeWandbRun()
    self.init_kwargs = None

  def init(self, **kwargs):
    self.init_kwargs = kwargs
    return self.run


def test_wandb_logs_rows_against_env_steps_in_offline_mode(tmp_path):
  wandb = _FakeWandb()
  run_log = loggers.RunLoggers(str(tmp_path), ["wandb"], 1000, quiet=True,
                               config={"learning_rate": 1e-3}, wandb_module=wandb)
  run_log.train({"env_steps": 500, "loss": 0.5, "sps": 100.0, "episodes": 3})
  run_log.eval({"env_steps": 1000, "eval_return_mean": 200.0, "completed": True})
  run_log.close()
  assert wandb.init_kwargs["mode"] == "offline"
  assert wandb.init_kwargs["dir"] == str(tmp_path)
  assert wandb.init_kwargs["config"] == {"learning_rate": 1e-3}
  assert wandb.run.metrics == [("*", "env_steps")]
  assert wandb.run.logged == [
      {"env_steps": 500.0, "train/loss": 0.5, "train/sps": 100.0, "train/episodes": 3.0},
      {"env_steps": 1000.0, "eval/eval_return_mean": 200.0}]
  assert wandb.run.finished


def test_wandb_without_the_package_names_the_extra_before_the_run(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError.
  installs = r"pip install wandb \(or, in the kit's checkout, pip install -e '\.\[wandb\]'\)"
  with pytest.raises(ValueError, match=installs):
    ExperimentConfig(logdir=str(tmp_path), loggers=("csv", "wandb"))  # At flag time.
  with pytest.raises(ValueError, match=installs):
    loggers.RunLoggers(str(tmp_path), ["csv", "wandb"], 1000, quiet=True)


def test_unknown_logger_is_named_with_the_choices(tmp_path):
  with pytest.raises(ValueError, match="terminal, csv, tensorboard, wandb"):
    ExperimentConfig(logdir=str(tmp_path), loggers=("terminal", "tensorbord"))


class _Terminal(io.StringIO):

  def isatty(self):
    return True


def test_progress_bar_shows_steps_rate_and_time_left_on_a_terminal(monkeypatch, tmp_path):
  err, out = _Terminal(), io.StringIO()
  monkeypatch.setattr(sys, "stderr", err)
  monkeypatch.setattr(sys, "stdout", out)
  run_log = loggers.RunLoggers(str(tmp_path), ["terminal"], 10_000)
  run_log.progress(2_000)
  run_log.train({"env_steps": 5_000, "loss": 0.25, "return_recent": 42.0})
  run_log.close()
  bar = err.getvalue()
  assert "5.00k/10.0k" in bar and "step/s" in bar and "return_recent=42.0" in bar
  assert "<" in bar  # tqdm's "elapsed<left".
  assert "[train] env_steps = 5000 | loss = 0.25" in out.getvalue()


def test_no_progress_bar_when_quiet_or_not_a_terminal(monkeypatch, tmp_path):
  err = io.StringIO()
  monkeypatch.setattr(sys, "stderr", err)
  for quiet in (False, True):
    run_log = loggers.RunLoggers(str(tmp_path), ["csv"], 1000, quiet=quiet)
    run_log.train({"env_steps": 500, "loss": 0.5})
    run_log.close()
  assert err.getvalue() == ""


def test_c51_support_check_warns_once_when_clipped_mass_is_high(tmp_path):
  from agents.dqn.run_checks import SupportCheck  # pylint: disable=import-outside-toplevel
  stream = io.StringIO()
  check = SupportCheck(DQNConfig(distributional=True, v_min=-10, v_max=10), stream=stream)
  run_log = loggers.RunLoggers(str(tmp_path), ["csv"], 100, quiet=True, train_checks=[check])
  with run_log:
    run_log.train({"env_steps": 10, "c51_clipped_mass": 0.3})
    assert stream.getvalue() == ""
    run_log.train({"env_steps": 20, "c51_clipped_mass": 0.8})
    run_log.train({"env_steps": 30, "c51_clipped_mass": 0.9})
  lines = stream.getvalue().splitlines()
  assert len(lines) == 1 and "80%" in lines[0] and "`v_min`=-10" in lines[0]
  assert "outside" in lines[0]
  assert "`v_max`=10" in lines[0] and "env step 20" in lines[0]


@pytest.mark.parametrize("names, imported", [(("csv", "tensorboard"), True), (("csv",), False)])
def test_preload_imports_the_tensorboard_writer_on_a_thread_only_when_asked(names, imported):
  # A fresh interpreter, so that nothing has imported tensorboardX yet.
  code = ("import sys, threading\n"
          "from acme_jax_dqn import loggers\n"
          "assert 'tensorboardX' not in sys.modules\n"
          f"thread = loggers.preload({names!r})\n"
          "assert thread is not threading.current_thread()\n"
          "thread.join(60)\n"
          "print('tensorboardX' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == str(imported)


def test_preload_leaves_a_failed_import_to_the_loggers(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` raises.
  escaped = []
  monkeypatch.setattr(threading, "excepthook", escaped.append)
  loggers.preload(("tensorboard",)).join(10)
  assert not escaped
  with pytest.raises(ImportError):
    loggers.TensorBoardLogger("/nonexistent-logdir-never-created")


_FAKE_TORCH = "import sys\nsys.stderr.write('fake torch imported\\n')\nclass Tensor:\n  pass\n"
# As botocore does while it imports: a `warnings.catch_warnings()` block, held here until the
# main thread has set a filter of its own (the `sync` module's events), then left.
_FAKE_BOTO3 = ("import sys, warnings, sync\nsys.stderr.write('fake boto3 imported\\n')\n"
               "with warnings.catch_warnings():\n  sync.entered.set()\n  sync.filtered.wait(30)\n")


@pytest.mark.parametrize("importer", ["import tensorboardX", "loggers.import_tensorboardx()",
                                      "import torch; loggers.import_tensorboardx()"])
def test_tensorboardx_imports_torch_and_boto3_unless_the_kit_hides_them(tmp_path, importer):
  # Installed torch, boto3 and google.cloud.storage stand in as packages on the path that
  # report their import. The plain import shows tensorboardX's own behaviour, which the kit
  # works around: should a release of tensorboardX stop importing them, that case fails and
  # the workaround can go. A torch imported before is used as it is (nothing to hide).
  # It runs on a thread, as `preload` does, while the main thread sets a warning filter (as
  # requests does for urllib3 when Ray imports it): boto3's `catch_warnings` block, left
  # after it, puts back the filters it found (CPython before free-threaded 3.14's
  # context-aware warnings), so the main thread's filter is lost.
  for name, text in (("torch", _FAKE_TORCH), ("boto3", _FAKE_BOTO3)):
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(text)
  (tmp_path / "google" / "cloud").mkdir(parents=True)  # Namespace packages, as installed.
  (tmp_path / "google" / "cloud" / "storage.py").write_text(
      "import sys\nsys.stderr.write('fake gcs imported\\n')\n")
  (tmp_path / "sync.py").write_text("import threading\nentered, filtered = "
                                     "threading.Event(), threading.Event()\n")
  logdir = tmp_path / "run"
  code = ("import sys, threading, time, warnings, sync\n"
          "from acme_jax_dqn import loggers\n"
          f"def load():\n  {importer}\n"
          "thread = threading.Thread(target=load)\n"
          "thread.start()\n"
          "while thread.is_alive() and not sync.entered.is_set():\n  time.sleep(0.01)\n"
          "warnings.filterwarnings('ignore', message='set on the main thread')\n"
          "sync.filtered.set()\n"
          "thread.join(60)\n"
          "print('torch' in sys.modules, 'boto3' in sys.modules,\n"
          "      'google.cloud.storage' in sys.modules,\n"
          "      any(f[1] and f[1].pattern == 'set on the main thread'\n"
          "          for f in warnings.filters))\n"
          f"writer = loggers.TensorBoardLogger({str(logdir)!r})\n"
          "writer.write('train', {'env_steps': 7, 'loss': 0.5})\n"
          "writer.close()\n"
          "import torch, boto3, google.cloud.storage\n"  # Afterwards all import as usual.
          "print(torch.Tensor.__name__)\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  plain, torch_first = importer == "import tensorboardX", importer.startswith("import torch")
  assert out.stdout.split()[-5:] == [str(plain or torch_first), str(plain), str(plain),
                                     str(not plain), "Tensor"]
  assert all(out.stderr.count(f"fake {name} imported") == 1 for name in ("torch", "boto3", "gcs"))
  assert _scalars(logdir, "train/loss") == [(7, 0.5)]


def test_the_named_packages_are_hidden_from_the_importing_thread_alone():
  finder = loggers._HideFromThisThread(  # pylint: disable=protected-access
      ["torch", "google.cloud"])
  for name in ("torch", "torch.nn", "google.cloud", "google.cloud.storage"):
    with pytest.raises(ModuleNotFoundError):
      finder.find_spec(name)
  assert [finder.find_spec(n) for n in ("numpy", "torchvision", "google", "google.protobuf",
                                         "google.cloudy")] == [None] * 5
  elsewhere = []
  thread = threading.Thread(target=lambda: elsewhere.append(finder.find_spec("torch")))
  thread.start()
  thread.join(10)
  assert elsewhere == [None]  # Another thread: left to the usual finders.
