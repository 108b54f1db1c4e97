"""Fixtures shared by test files: a finished tiny run with a checkpoint."""

import os
import subprocess
import sys

import pytest
from tests.fakes import ROOT, TINY

# XLA sizes its CPU threads from these where a host sets them, and the kit then leaves them
# be (`--cpu_threads`); the runs the tests start make their own choice.
for _name in ("PJRT_NPROC", "NPROC"):
  os.environ.pop(_name, None)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
  """A tiny run with a checkpoint at 400 env steps (tests copy it with `fakes.copy_run`)."""
  logdir = tmp_path_factory.mktemp("saved") / "run"
  result = subprocess.run([sys.executable, "-m", "launch.run_dqn", f"--flagfile={TINY}",
                           f"--logdir={logdir}", "--total_steps=400", "--eval_every=0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  return logdir
