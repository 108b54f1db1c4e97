"""Distributed mode on Ray: the rate limiter, killed nodes, resume, a two-node cluster, the newer
variants, bad input."""

import csv
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from agents.dqn.config import ConfigError
from tests.fakes import ROOT, damage_checkpoints

TINY = os.path.join("tests", "configs", "tiny_distributed.cfg")


def _cmd(*args):
  return [sys.executable, "-m", "launch.run_dqn", f"--flagfile={TINY}", *args]


def _wait_for(path, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.exists(path):
      return True
    time.sleep(0.2)
  return False


def _idle_ray_workers(node_pid):
  """The processes beside a node's (children of its raylet) that Ray started and left idle."""
  idle = []
  for process in psutil.Process(node_pid).parent().children():
    try:
      if " ".join(process.cmdline()).startswith("ray::IDLE"):
        idle.append(process.pid)
    except psutil.NoSuchProcess:  # Ended meanwhile.
      continue
  return idle


def _kill_node_mid_run(logdir, total_steps, node, timeout, *extra, check=None):
  """Starts a run, SIGKILLs `node(nodes.json)`'s pid once training logs (after `check(nodes)`),
  returns (process, out, err)."""
  process = subprocess.Popen(_cmd(f"--logdir={logdir}", f"--total_steps={total_steps}",
                                  "--log_every=500", "--eval_every=0", *extra),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
  try:
    assert _wait_for(logdir / "nodes.json") and _wait_for(logdir / "train.csv")
    nodes = json.loads((logdir / "nodes.json").read_text())
    if check:
      check(nodes)
    os.kill(node(nodes)["pid"], signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=timeout)
  finally:
    process.kill()
  return process, stdout, stderr


def test_killed_actor_restarts_and_the_counts_add_up(tmp_path):
  logdir = tmp_path / "run"
  idle, seen = [], []  # The private Ray starts no workers beside the nodes' own processes.

  def check(nodes):
    seen.append(nodes)
    idle.extend(_idle_ray_workers(nodes["learner"]["pid"]))

  process, stdout, stderr = _kill_node_mid_run(logdir, 6000, lambda n: n["actors"][0], 300,
                                               check=check)
  assert process.returncode == 0, (stdout[-2000:], stderr[-3000:])
  assert idle == []
  # Only the learner's JAX may start a GPU client (on a GPU host); the other processes keep
  # JAX on the CPU.
  users = os.environ.get("JAX_PLATFORMS", "")
  assert seen[0]["learner"]["jax_platforms"] == users
  others = [*seen[0]["actors"], seen[0]["replay"], seen[0]["evaluator"], seen[0]["driver"]]
  assert [n["jax_platforms"] for n in others] == [users or "cpu"] * 5
  summary = json.loads((logdir / "summary.json").read_text())
  # One restart (a new process rejoined), however many calls failed while Ray restarted it.
  assert summary["actor_restarts"] == [1, 0] and summary["actor_restarts_total"] == 1
  assert summary["actors_lost"] == []
  # The replay counts env steps only for accepted inserts, once each.
  assert summary["env_steps"] == sum(summary["actor_steps"])
  assert summary["env_steps"] >= 6000 and all(n > 0 for n in summary["actor_steps"])
  assert summary["learner_steps"] > 0 and summary["replay_inserts"] > 0
  base, alpha = 0.4, 7.0  # Ape-X: eps_i = base ** (1 + alpha * i / (N - 1)).
  np.testing.assert_allclose(summary["actor_epsilons"], [base, base ** (1 + alpha)],
                             rtol=1e-5)
  assert np.isfinite(summary["eval_return_mean"])


def test_an_actor_whose_restart_is_refused_is_left_out_and_the_run_completes(tmp_path):
  """Ray does not try again an actor whose constructor raised: the others carry the run."""
  logdir = tmp_path / "run"
  process, stdout, stderr = _kill_node_mid_run(
      logdir, 6000, lambda n: n["actors"][0], 300,
      "--env=gymnasium:tests.fakes:CartPoleRefusedOnRestart-v0")
  assert process.returncode == 0, (stdout[-2000:], stderr[-3000:])
  # Seen during the run ("goes on") or, when the run reached its end first, at its end ("ended").
  assert re.search(r"^warning: actor 0 could not start again after a crash: --num_envs=1: this "
                   r"host cannot hold the copies\. Use another host\. The run (goes on|ended) "
                   r"with 1 of 2 actors\.$", stderr, re.M), stderr[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  # Ray's restart failed in the constructor: no new process of actor 0 rejoined.
  assert summary["actors_lost"] == [0] and summary["actor_restarts"] == [0, 0]
  assert summary["env_steps"] == sum(summary["actor_steps"]) >= 6000


def test_a_crashed_evaluator_restarts_and_its_evaluation_runs_again(tmp_path):
  logdir = tmp_path / "run"
  result = subprocess.run(
      _cmd(f"--logdir={logdir}", "--total_steps=8000", "--log_every=1000", "--eval_every=1000",
           "--env=gymnasium:tests.fakes:CartPoleCrashingTheEvaluator-v0"),
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["evaluator_restarts"] == 1
  with open(logdir / "eval.csv") as f:
    rows = list(csv.DictReader(f))
  steps = [int(r["env_steps"]) for r in rows]
  # The first evaluation (due at 1,000) ran again once the evaluator was back, then the others.
  assert steps == sorted(set(steps)) and len(steps) >= 3 and steps[-1] == summary["env_steps"]
  assert 1000 <= steps[0] < steps[-1] and all(np.isfinite(float(r["eval_return_mean"]))
                                              for r in rows)


def test_nodes_that_refuse_the_run_at_their_start_give_one_line(tmp_path):
  result = subprocess.run(
      _cmd(f"--logdir={tmp_path / 'run'}", "--env=gymnasium:tests.fakes:CartPoleRefusedInRay-v0"),
      cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [  # One line: no traceback, no Ray warning.
      "error: an actor node refused the run on its Ray host: --num_envs=1: this host cannot "
      "hold the copies. Use another host."]


def test_actors_run_on_the_second_node_of_a_cluster(tmp_path):
  """Actor nodes placed by a custom resource on the second node, each stepping 4 envpool copies;
  the learner there too, by the GPU that node declares (`learner_gpus`; Ray shows the learner
  that GPU alone)."""
  from ray.cluster_utils import Cluster  # pylint: disable=import-outside-toplevel
  os.environ.setdefault("RAY_AUTH_MODE", "disabled")
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
  try:
    worker = cluster.add_node(num_cpus=2, num_gpus=1, resources={"actor_host": 4})
    cluster.wait_for_nodes()
    logdir = tmp_path / "run"
    result = subprocess.run(
        _cmd(f"--logdir={logdir}", "--total_steps=2000", "--log_every=1000",
             "--eval_every=0", f"--ray_address={cluster.address}",
             "--actor_resource=actor_host", "--env=envpool:CartPole-v1", "--num_envs=4",
             "--learner_gpus=1"),
        cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["actor_node_ids"] == [worker.node_id] * 2
    learner = json.loads((logdir / "nodes.json").read_text())["learner"]
    assert (learner["node_id"], len(learner["gpu_ids"])) == (worker.node_id, 1)
    assert summary["env"] == "envpool:CartPole-v1" and summary["config"]["num_envs"] == 4
    assert summary["env_steps"] == sum(summary["actor_steps"]) >= 2000
    assert summary["ray_address"] == cluster.address
  finally:
    cluster.shutdown()
    for s, handler in handlers.items():  # Ray's node handlers would outlive the cluster.
      signal.signal(s, handler)


def test_learner_gpus_that_no_machine_has_are_refused_before_any_node_starts(tmp_path):
  result = subprocess.run(_cmd(f"--logdir={tmp_path / 'run'}", "--learner_gpus=1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "error: --learner_gpus=1: no machine of the Ray cluster has 1 GPU (the most on one: 0). "
      "Use --learner_gpus=0, or join a cluster with a GPU machine (--ray_address)."]
  assert not (tmp_path / "run" / "nodes.json").exists()


def test_unreachable_ray_address_fails_within_seconds(tmp_path):
  start = time.time()
  result = subprocess.run(_cmd(f"--logdir={tmp_path / 'run'}", "--ray_address=127.0.0.1:9"),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert "--ray_address=127.0.0.1:9: no Ray head node answers there" in result.stderr
  assert "Traceback" not in result.stderr
  assert time.time() - start < 60  # Mostly the JAX import; the check itself takes <= 3 s.


def test_replay_too_small_through_the_cli(tmp_path):
  result = subprocess.run(_cmd(f"--logdir={tmp_path / 'run'}", "--replay_capacity=230"),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "too small for the rate limiter" in result.stderr


def test_more_actors_than_the_host_can_run_as_processes_are_refused_before_ray_starts(tmp_path):
  from agents.dqn import ray_cluster  # pylint: disable=import-outside-toplevel
  each, server = ray_cluster.NODE_PROCESS_BYTES, ray_cluster.VARIABLE_SERVER_BYTES
  # Lower bounds: what a process holds of its own once it has imported what every node of the
  # kit imports, and what the variable server's imports.
  for module, bound in (("agents.dqn.distributed_nodes", each),
                        ("agents.dqn.variable_server", server)):
    private = subprocess.run(
        [sys.executable, "-c", f"import ray, {module}, sys; print(next(int(line.split("
         ")[1]) * 1024 for line in open('/proc/self/status') if line.startswith('RssAnon:')), "
         "'jax' in sys.modules)"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert bound < int(private[0]) and private[1] == str(bound == each)  # The server: no JAX.
  five = 8 * each + server  # 5 actors and 3 other nodes of the kit, and the variable server.
  ray_cluster.check_node_processes(5, limit=int((five + each // 2) / 0.9))
  ray_cluster.check_node_processes(5, limit=math.ceil(five / 0.9))  # Just fits.
  with pytest.raises(ConfigError, match=r"`num_actors`=5: .* Use `num_actors` <= 4,"):
    ray_cluster.check_node_processes(5, limit=math.ceil(five / 0.9) - 2)  # Just does not.
  with pytest.raises(ConfigError, match=r"`num_actors`=6: .* 10 of them .*96 MiB each, the "
                     r"variable server at 32 MiB.* need at least 0.9 GiB and the host holds "
                     r"0.9 GiB. Use `num_actors` <= 5,"):
    ray_cluster.check_node_processes(6, limit=int((five + each // 2) / 0.9))
  with pytest.raises(ConfigError, match=r"Not one actor fits beside the other nodes here: use a "
                     r"cluster \(`ray_address`\)\.$"):
    ray_cluster.check_node_processes(1, limit=int((4 * each + server - 1) / 0.9))
  result = subprocess.run(_cmd(f"--logdir={tmp_path / 'run'}", "--num_actors=100000",
                               "--replay_capacity=4000000"),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "error: --num_actors=100000: a Ray started on this machine runs" in result.stderr
  assert not (tmp_path / "run" / "nodes.json").exists()  # No node started.


# Variants beyond plain DQN ride on the fault tests below, which start their own programs anyway.
QR_NOISY = ("--quantile", "--num_quantiles=8", "--double_q", "--dueling", "--noisy",
            "--noisy_torso", "--noapex_epsilons")  # Noise explores.
MIQN = ("--iqn", "--iqn_num_taus=8", "--iqn_num_target_taus=8", "--iqn_num_policy_taus=4",
        "--iqn_num_cosines=8", "--munchausen", "--layer_norm")


def _assert_the_variant_ran(summary, flags):
  for field in ("quantile", "noisy", "munchausen", "iqn", "layer_norm"):
    assert summary["config"][field] == (f"--{field}" in flags), field


def test_a_killed_learner_restarts_from_its_last_checkpoint_and_the_run_completes(tmp_path):
  """QR-DQN with noisy nets (torso and head), double and dueling; the nodes of a Ray started by
  the run compile into the run's compilation cache."""
  logdir, cache = tmp_path / "run", tmp_path / "xla"
  process, stdout, stderr = _kill_node_mid_run(logdir, 5000, lambda n: n["learner"], 300,
                                               "--checkpoint_every=1000",
                                               f"--compilation_cache_dir={cache}", *QR_NOISY)
  assert process.returncode == 0, (stdout[-2000:], stderr[-3000:])
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["learner_restarts"] >= 1 and summary["completed"]
  assert summary["env_steps"] >= 5000 and summary["env_steps"] == sum(summary["actor_steps"])
  assert summary["learner_steps"] > 0 and np.isfinite(summary["eval_return_mean"])
  _assert_the_variant_ran(summary, QR_NOISY)
  # The replay node's sampler and the learner's SGD step: only nodes compile these.
  for program in ("jit_sample_batches-", "jit_batches_step-"):
    assert any(f.startswith(program) for f in os.listdir(cache)), sorted(os.listdir(cache))
  with open(logdir / "train.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert rows and np.isfinite(float(rows[-1]["loss"]))


def test_a_killed_replay_node_ends_the_run_with_a_clear_error(tmp_path):
  logdir = tmp_path / "run"
  process, _, stderr = _kill_node_mid_run(logdir, 200000, lambda n: n["replay"], 120)
  assert process.returncode == 3, stderr[-3000:]
  assert "The learner or replay node crashed" in stderr and "Traceback" not in stderr
  assert not (logdir / "summary.json").exists()


def _a_damaged_checkpoint_is_refused_before_any_node_starts(tmp_path, logdir, args):
  """A copy of the run with its checkpoint's arrays cut off: --resume is refused (exit code 2)
  before Ray starts its nodes (they would write nodes.json), and the checkpoint is set aside,
  not deleted."""
  damaged = tmp_path / "damaged"
  shutil.copytree(logdir, damaged)
  (damaged / "nodes.json").unlink()
  damage_checkpoints(damaged / "checkpoints")
  args = [a.replace(str(logdir), str(damaged)) for a in args]
  refused = subprocess.run(_cmd(*args, "--resume"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert "No readable checkpoint" in refused.stderr and "Traceback" not in refused.stderr
  assert not (damaged / "nodes.json").exists()  # No node started.
  assert glob.glob(str(damaged / "checkpoints" / "corrupt-*"))


def test_sigkill_after_a_checkpoint_then_resume_counts_every_step_once(tmp_path):
  """The driver dies (SIGKILL) right after its checkpoint at 1,500 steps; --resume goes on from
  the saved replay, learner and counts to the budget, and the counts add up exactly. The run is
  M-IQN (Munchausen + IQN) with LayerNorm."""
  from agents.dqn.checkpoints import SIGKILL_AT_STEP_VAR  # pylint: disable=import-outside-toplevel
  logdir = tmp_path / "run"
  args = (f"--logdir={logdir}", "--total_steps=3000", "--checkpoint_every=1500",
          "--log_every=500", "--eval_every=0", *MIQN)
  # Output to files: Ray's agents outlive a SIGKILLed driver for a while and would hold pipes.
  with open(tmp_path / "killed.err", "w") as err:
    killed = subprocess.run(_cmd(*args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                            timeout=300, env={**os.environ, SIGKILL_AT_STEP_VAR: "1500"})
  assert killed.returncode == -signal.SIGKILL, (tmp_path / "killed.err").read_text()[-3000:]
  assert not (logdir / "summary.json").exists()
  _a_damaged_checkpoint_is_refused_before_any_node_starts(tmp_path, logdir, args)
  with open(tmp_path / "resumed.err", "w") as err:
    resumed = subprocess.run(_cmd(*args, "--resume"), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=err, timeout=300)
  assert resumed.returncode == 0, (tmp_path / "resumed.err").read_text()[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  saved = summary["resumed_from_step"]
  assert 1500 <= saved < 3000
  assert summary["env_steps"] >= 3000 and summary["env_steps"] == sum(summary["actor_steps"])
  assert summary["env_steps_this_start"] == summary["env_steps"] - saved
  # Rates count this start's steps alone. Counting every step would read at least
  # env_steps / env_steps_this_start (about 2) times this start's steps over its time after
  # compiling; below that, the margin is this start's time outside training, which a loaded
  # host stretches (1.58x seen beside another heavy test; 1.11x alone).
  counted_all = summary["env_steps"] / summary["env_steps_this_start"]
  assert summary["actor_sps"] < 0.95 * counted_all * summary["sps_after_compile"]
  _assert_the_variant_ran(summary, MIQN)
  with open(logdir / "train.csv") as f:
    rows = list(csv.DictReader(f))
  steps = [int(r["env_steps"]) for r in rows]
  assert steps == sorted(steps) and len(steps) == len(set(steps))  # No row written twice.
  before = [int(r["learner_steps"]) for r in rows if int(r["env_steps"]) <= saved]
  after = [int(r["learner_steps"]) for r in rows if int(r["env_steps"]) > saved]
  assert before and after and after[0] >= before[-1] > 0  # Continued, not from 0.
  assert np.isfinite(float(rows[-1]["loss"]))
  # A resume of the finished run trains nothing and ends at once, with its summary.
  again = subprocess.run(_cmd(*args, "--resume"), cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["env_steps_this_start"] == 0 and summary["learner_steps_per_s"] == 0.0
  assert summary["resumed_from_step"] == summary["env_steps"] >= 3000


def test_the_distributed_cartpole_preset_learns(tmp_path):
  """launch/configs/cartpole_distributed.cfg on a short budget: well above a random policy."""
  logdir = tmp_path / "run"
  with open(tmp_path / "err", "w") as err:
    result = subprocess.run(
        [sys.executable, "-m", "launch.run_dqn",
         "--flagfile=launch/configs/cartpole_distributed.cfg", f"--logdir={logdir}",
         "--total_steps=12000", "--eval_every=0", "--quiet", "--nosave_checkpoints"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, timeout=600)
  assert result.returncode == 0, (tmp_path / "err").read_text()[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["env_steps"] >= 12000 and summary["learner_steps"] > 5000
  assert summary["eval_return_mean"] > 5 * 22.0, summary["eval_return_mean"]  # Random: ~22.
