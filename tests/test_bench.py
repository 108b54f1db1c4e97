"""The bench scripts: PureJaxRL read from a checkout (never vendored); what the steady bench
times."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from bench import anakin_programs
from bench import harness
from bench import hlo_count
from bench import purejaxrl_peer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The three lines of purejaxrl/dqn.py (commit 31756b1) the loader rewrites, in a stand-in script.
_STAND_IN = '''
import jax.numpy as jnp


class Env:
    def step(self, rng, state, action, params):
        return 1, 2, 3, jnp.bool_(True), jnp.bool_(False), {}


def make_train(config):
    def train(rng):
        env, env_params, _env_state, _action = Env(), None, None, None
        _obs, _, _reward, _done, _ = env.step(rng, _env_state, _action, env_params)

        def vmap_step(n):
            return lambda rng, env_state, action: env.step(rng, env_state, action, None)

        class TrainState:
            timesteps = 0

            def replace(self, timesteps):
                return timesteps

        if True:
            train_state, env_state, action = TrainState(), None, None
            obs, env_state, reward, done, info = vmap_step(config["NUM_ENVS"])(
                rng, env_state, action
            )
            train_state = train_state.replace(
                timesteps=train_state.timesteps + config["NUM_ENVS"]
            )
        return bool(_done), bool(done), train_state
    return train
'''


def _checkout(tmp_path, text):
  os.makedirs(tmp_path / "purejaxrl")
  (tmp_path / "purejaxrl" / "dqn.py").write_text(text)
  return str(tmp_path)


def test_the_loader_rewrites_the_step_unpacking_for_gymnax_1(tmp_path):
  """gymnax 1.0's step returns (obs, state, reward, terminated, truncated, info); the script
  unpacks five values, so the loader makes `done` their `or`."""
  module = purejaxrl_peer.load(_checkout(tmp_path, _STAND_IN))
  assert module.make_train({"NUM_ENVS": 3})(None) == (True, True, 3)
  with open(tmp_path / "purejaxrl" / "dqn.py") as f:
    assert "_term, _trunc" not in f.read()  # The checkout itself is left as it was.


# The lines around the key purejaxrl/dqn.py's `train` sets aside for a dummy one (commit
# 31756b1), in a stand-in that returns the key its network's init would take.
_DUMMY_KEY = '''
import jax


def network_key(rng):
    if True:
        class QNetwork:
            def __init__(self, action_dim):
                pass

        class Env:
            def action_space(self, params):
                return type("Discrete", (), {"n": 2})

        env, env_params = Env(), None
        rng = jax.random.PRNGKey(0)  # use a dummy rng here
        dummy = rng  # What the example transition takes.
        network = QNetwork(action_dim=env.action_space(env_params).n)
        rng, _rng = jax.random.split(rng)
        return _rng, dummy
'''


def test_purejaxrl_seeds_share_a_key_unless_the_loader_keeps_each_seeds_own(tmp_path):
  """As the script is, every vmapped seed's network is made from the same dummy key; with
  `independent_seeds` each from its own."""
  checkout = _checkout(tmp_path, _STAND_IN + _DUMMY_KEY)
  keys = jax.random.split(jax.random.PRNGKey(7), 3)
  shared, dummy = jax.vmap(purejaxrl_peer.load(checkout).network_key)(keys)
  apart, dummy_apart = jax.vmap(
      purejaxrl_peer.load(checkout, independent_seeds=True).network_key)(keys)
  assert len({tuple(np.asarray(k)) for k in shared}) == 1
  assert len({tuple(np.asarray(k)) for k in apart}) == 3
  assert tuple(np.asarray(apart[0])) == tuple(np.asarray(jax.random.split(keys[0])[1]))
  # The example transition keeps the dummy key either way.
  for d in (*dummy, *dummy_apart):
    assert tuple(np.asarray(d)) == tuple(np.asarray(jax.random.PRNGKey(0)))


def test_a_checkout_without_the_lines_independent_seeds_rewrites_is_refused_by_name(
    tmp_path, capsys):
  checkout = _checkout(tmp_path, _STAND_IN)  # No dummy key in it.
  purejaxrl_peer.load(checkout)  # As it is: nothing missing.
  with pytest.raises(SystemExit) as stop:
    purejaxrl_peer.load(checkout, independent_seeds=True)
  assert stop.value.code == 2
  assert "use a dummy rng here` is not there" in capsys.readouterr().err


def test_a_script_of_another_commit_is_refused_by_name(tmp_path, capsys):
  checkout = _checkout(tmp_path, _STAND_IN.replace("_done, _ = env.step", "_d, _ = env.step"))
  with pytest.raises(SystemExit) as stop:
    purejaxrl_peer.load(checkout)
  assert stop.value.code == 2
  assert "the benches read PureJaxRL at commit 31756b1" in capsys.readouterr().err


def test_gpu_speed_checks_the_checkout_without_a_gpu_client_of_its_own(tmp_path):
  """The bench's own process stays on JAX's CPU backend (loading the script starts a backend),
  so a GPU's memory is left to the timed processes."""
  checkout = _checkout(tmp_path, _STAND_IN)
  result = subprocess.run(
      [sys.executable, "-c", "from bench import gpu_speed; import jax; "
       f"gpu_speed.check_peer({str(checkout)!r}); jax.numpy.zeros(1); "
       "print(jax.config.jax_platforms, jax.default_backend())"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
  assert result.stdout.split()[-2:] == ["cpu", "cpu"], result.stdout


_START_S = '''
import types
from bench import gpu_speed, harness
gpu_speed.FLAGS(["gpu_speed"])
clock = [100.0, 125.0, 200.0, 230.0]  # Each process is launched, then ends, 25 s and 30 s on.
gpu_speed.time.perf_counter = lambda: clock.pop(0)
gpu_speed.subprocess.run = lambda *a, **k: types.SimpleNamespace(
    returncode=0, stdout='{"compile_s": 3.0, "run_s": 4.0, "sps_after_compile": 1.0}\\n')
harness.run_preset = lambda *a, **k: {"compile_s": 6.0, "wall_s": 20.0, "eval_s": 0.1,
                                      "sps_after_compile_all_seeds": 1.0}
print(gpu_speed.peer(1)["outside_run_s"],
      gpu_speed.ours(1, "gymnax:CartPole-v1", "t")["outside_run_s"])
'''


def test_gpu_speed_takes_the_same_time_from_either_process_the_run_after_compiling():
  """PureJaxRL's process less its timed run (25 - 4 s), ours less what follows compile_s
  (30 - (20 - 6) s): each counts its interpreter, imports, compile and exit alike."""
  out = subprocess.run([sys.executable, "-c", _START_S], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, check=True)
  assert [float(v) for v in out.stdout.split()[-2:]] == [21.0, 16.0]


_FAILED = '''
import subprocess, types
from bench import gpu_speed, harness
gpu_speed.FLAGS(["gpu_speed"])
gpu_speed.subprocess.run = lambda *a, **k: types.SimpleNamespace(
    returncode=1, stdout="", stderr="Traceback (most recent call last):\\n  ...\\n"
    "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 16 bytes.\\n")
try:
  gpu_speed.peer(4096)
except SystemExit as stop:
  print(repr(stop.code))
def refused(*a, **k):
  raise subprocess.CalledProcessError(2, ["python", "-m", "launch.run_dqn"])
harness.run_preset = refused
try:
  gpu_speed.ours(4096, "gymnax:CartPole-v1", "t")
except SystemExit as stop:
  print(repr(stop.code))
'''


def test_gpu_speed_reports_a_failed_run_in_one_line_naming_the_seeds():
  """No child traceback: the peer's last error line, or ours' exit code (2: the run refused
  its flags, on stderr above), each with the `--num_seeds` that failed."""
  out = subprocess.run([sys.executable, "-c", _FAILED], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, check=True)
  peer_line, ours_code = out.stdout.strip().splitlines()[-2:]
  assert peer_line == repr("PureJaxRL's dqn.py failed at --num_seeds=4096 (exit code 1): "
                           "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                           "allocating 16 bytes.")
  assert ours_code == "2"
  assert "ours failed on gymnax:CartPole-v1 at --num_seeds=4096 (exit code 2)." in out.stderr


_FAKE_RUNS = '''
import sys
from absl import app
from bench import gpu_speed, harness
out, ours_sps, fake_peer, *flags = sys.argv[1:]
ours_sps = iter(float(v) for v in ours_sps.split(","))
if fake_peer != "no":  # PureJaxRL's runs at 1,000 env steps/s, and no checkout to read;
  gpu_speed.purejaxrl_peer.load = lambda *a, **k: None  # with its seeds independent, at 800.
  gpu_speed.peer = lambda n, independent_seeds=False: {
      "compile_s": 4.0, "setup_s": 6.5, "outside_run_s": 8.0,
      "sps_after_compile": 800.0 if independent_seeds else 1000.0}
harness.run_preset = lambda *a, **k: {"compile_s": 6.0, "wall_s": 20.0, "eval_s": 0.1,
                                      "sps_after_compile_all_seeds": next(ours_sps)}
sys.argv = ["gpu_speed", *flags, "--out=" + out]
app.run(gpu_speed.main)
'''


def _gpu_speed_on_fake_runs(out, ours_sps, fake_peer, *flags):
  """bench/gpu_speed.py's table at `out`, our runs' env steps/s taken from `ours_sps` in turn."""
  result = subprocess.run(
      [sys.executable, "-c", _FAKE_RUNS, str(out), ",".join(map(str, ours_sps)),
       "yes" if fake_peer else "no", *flags], cwd=ROOT, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  return out.read_text()


def test_a_breakout_only_bench_run_needs_no_checkout(tmp_path):
  """No CartPole seeds, no PureJaxRL run: its checkout is not asked for."""
  table = _gpu_speed_on_fake_runs(tmp_path / "breakout.md", [1000], False, "--num_seeds=",
                                  "--minatar_seeds=1")
  assert "| ours | Breakout-MinAtar | 1 | 6.0 | 1,000 |" in table


def test_gpu_speed_gives_the_median_of_its_pairs_and_judges_the_goal_by_it(tmp_path):
  # Against PureJaxRL's 1,000 env steps/s: 0.90x, 1.30x, 1.25x.
  table = _gpu_speed_on_fake_runs(tmp_path / "pairs.md", [900, 1300, 1250], True,
                                  "--num_seeds=1", "--minatar_seeds=", "--repeats=3")
  assert ("- 1 seed(s), median of 3 pairs: 1.25x PureJaxRL's env steps/s (lowest 0.90x, "
          "highest 1.30x; goal >= 1.2: met).") in table
  # Ours' compile (6.0 s) against PureJaxRL's lower and compile (4.0 s), and against its span
  # from its imports to its compiled program (6.5 s).
  assert ("compile 6.0 s against 4.0 s (goal <= +3 s: met); from the imports to ready, as "
          "ours' compile s counts, 6.0 s against 6.5 s (the same goal: met)") in table
  assert ("- PureJaxRL, CartPole, 1 seed(s), pair 3: 6.5 s from its imports to its compiled "
          "program (the environment and keys, then lower and compile 4.0 s).") in table


def test_gpu_speed_sets_many_seeds_against_purejaxrl_with_its_seeds_independent(tmp_path):
  table = _gpu_speed_on_fake_runs(tmp_path / "apart.md", [1300, 1200], True,
                                  "--num_seeds=1,4", "--minatar_seeds=",
                                  "--purejaxrl_independent_seeds")
  assert "| PureJaxRL dqn.py, seeds independent | CartPole-v1 | 4 | 4.0 | 800 |" in table
  assert "seeds independent | CartPole-v1 | 1 |" not in table  # One seed has no others.
  assert ("- 4 seed(s), pair 1, beside PureJaxRL with its seeds independent: ours 1.50x its "
          "env steps/s; PureJaxRL as it is ran 1.25x them.") in table
  assert "- 4 seed(s), pair 1: 1.20x PureJaxRL's env steps/s (goal >= 1.2: met)" in table
  table = _gpu_speed_on_fake_runs(tmp_path / "apart_pairs.md", [1200, 1600], True,
                                  "--num_seeds=4", "--minatar_seeds=", "--repeats=2",
                                  "--purejaxrl_independent_seeds")
  assert ("- 4 seed(s), median of 2 pairs beside PureJaxRL with its seeds independent: 1.75x "
          "its env steps/s (lowest 1.50x, highest 2.00x).") in table


def test_a_bench_run_without_the_checkout_says_what_to_clone_before_running(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "bench.gpu_speed", "--num_seeds=1", "--minatar_seeds=",
       f"--logdir={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert ("--purejaxrl_dir='': no purejaxrl/dqn.py there. Clone "
          "https://github.com/luchris429/purejaxrl") in result.stderr + result.stdout
  assert not (tmp_path / "runs").exists()


_STEADY_OURS = '''
import sys
from absl import flags
import jax
from acme_jax_dqn import checkpointing, xla_setup
from bench import steady_speed
from launch import flags as launch_flags
flags.FLAGS(["steady"] + sys.argv[1:])
experiment = launch_flags.experiment_from_flags()
with xla_setup.prng_impl(experiment.prng_impl):
  _, run, plan = steady_speed.ours_program(experiment, launch_flags.config_from_flags())
  print(plan.num_chunks, *(checkpointing.params_checksum(jax.device_get(run())) for _ in range(2)))
'''


@pytest.mark.parametrize("seed_flags", [[], ["--num_seeds=2", "--cpu_devices=1"]])
def test_the_steady_bench_times_the_run_that_run_dqn_makes_every_call(tmp_path, seed_flags):
  """bench/steady_speed.py calls ours again and again in one process: each call must train the
  same parameters as `launch.run_dqn` with the same flags (here over 3 chunks; with two seeds
  on one device, whose warm-up runs as loops of its own, over two chunk programs)."""
  run_flags = ["--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--total_steps=3000",
               "--min_replay_size=1000", "--log_every=1000", "--compilation_cache_dir=",
               *seed_flags]
  steady = subprocess.run([sys.executable, "-c", _STEADY_OURS, *run_flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
  chunks, first, second = steady.stdout.split()[-3:]
  subprocess.run([sys.executable, "-m", "launch.run_dqn", *run_flags,
                  f"--logdir={tmp_path}", "--quiet", "--nosave_checkpoints"],
                 cwd=ROOT, check=True, capture_output=True, timeout=300)
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  assert int(chunks) >= 2
  assert first == second == summary["params_checksum"]


def test_the_cpu_time_of_a_busy_thread_is_read_as_the_busiest():
  """What the steady bench reads to tell a call on one thread from one split between two."""
  spun, done = threading.Event(), threading.Event()

  def spin():
    end = time.process_time() + 0.4  # This process's CPU time: 0.4 s of it spent here.
    while time.process_time() < end:
      pass
    spun.set()
    done.wait()  # Alive while read: /proc lists live threads only.

  before = harness.thread_cpu_s()
  worker = threading.Thread(target=spin)
  worker.start()
  spun.wait()
  busiest, rest = harness.busiest_and_rest(before, harness.thread_cpu_s())
  done.set()
  worker.join()
  assert busiest >= 0.3 and rest < 0.2, (busiest, rest)


def test_a_call_counts_as_split_when_other_threads_took_a_quarter_of_its_cpu_time():
  # Seen on 2 cores: one worker thread (2.28 + 0.03 CPU s), split (2.03 + 1.89).
  assert anakin_programs.split_calls([(2.28, 0.03), (2.03, 1.89), (1.5, 0.5), None]) == "2 of 3"
  assert anakin_programs.split_calls([None, None]) == "n/a"


def test_one_cpu_core_that_cannot_apply_is_refused_in_one_line():
  """Under --one_cpu_core the benches make XLA's CPU client on one core; where it exists
  already they say so instead of timing both cores as if on one."""
  code = ("import sys, jax\n"
          "from absl import flags\n"
          "from bench import harness\n"
          "from launch import flags as launch_flags\n"
          "launch_flags.define_flags()\n"
          "flags.FLAGS(['b', '--run_mode=anakin', '--one_cpu_core'])\n"
          "jax.numpy.zeros(1)  # The client exists from here.\n"
          "harness.anakin_run_flags(1)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].endswith(
      "--one_cpu_core: XLA's CPU client exists already (or this platform sets no CPU "
      "affinity), so it cannot be made on one core here; run without --one_cpu_core.")


def test_the_cpu_threads_bench_runs_each_value_in_turn_and_finds_the_same_parameters(tmp_path):
  """bench/cpu_threads.py: one cold run_dqn per --cpu_threads value each round, each run's
  summary.json read back (the client's threads as the run set them), the same parameters."""
  out = tmp_path / "cpu_threads.md"
  result = subprocess.run(
      [sys.executable, "-m", "bench.cpu_threads", "--threads=2,1", "--repeats=1",
       f"--logdir={tmp_path / 'runs'}", f"--out={out}",
       "--run_flags=--total_steps=3000 --min_replay_size=1000 --replay_capacity=2000 "
       "--log_every=3000 --eval_episodes=2 --hidden_sizes=32,32"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| 1 |")]
  assert [(row[1], row[2]) for row in rows] == [("2", "2"), ("1", "1")], rows
  assert "--cpu_threads=1: median" in out.read_text()
  assert "Parameters: the same in every run." in out.read_text()
  bad = subprocess.run([sys.executable, "-m", "bench.cpu_threads", "--threads=-1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "--threads=-1" in bad.stderr.strip().splitlines()[-1]


def test_the_steady_bench_without_the_checkout_says_what_to_clone():
  result = subprocess.run(
      [sys.executable, "-m", "bench.steady_speed",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert "--purejaxrl_dir='': no purejaxrl/dqn.py there. Clone" in result.stderr


def test_the_warmup_loops_bench_finds_the_three_chunk_structures_train_the_same(tmp_path):
  out = tmp_path / "warmup_loops.md"
  subprocess.run(
      [sys.executable, "-m", "bench.warmup_loops",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--seed_counts=2",
       "--total_steps=1200", "--min_replay_size=400", "--log_every=400", "--repeats=1",
       f"--out={out}"], cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
  rows = [line for line in out.read_text().splitlines() if line.startswith("| 2 |")]
  assert len(rows) == 1 and rows[0].split("|")[2].strip() == "39 / 40", rows
  assert len(rows[0].split("|")[3].split(",")) == 3, rows  # Three compile times.
  cells = [c.strip() for c in rows[0].split("|")[1:-1]]
  assert cells[8] == "yes", rows
  # Each structure's one timed call, split between XLA's worker threads or not.
  assert re.fullmatch(r"[01] of 1, [01] of 1, [01] of 1", cells[9]), rows


def _pair_bench_row(tmp_path, bench: str, *args: str):
  """(the row of `bench` (a bench that compares two chunk structures) for two seeds on one CPU
  device, with its two programs' cells as (kernels, copies, MB); the table's text)."""
  out = tmp_path / f"{bench}.md"
  subprocess.run(
      [sys.executable, "-m", f"bench.{bench}",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--seed_counts=2",
       "--total_steps=1200", "--min_replay_size=400", "--log_every=400", "--repeats=1",
       f"--out={out}", *args], cwd=ROOT, check=True, capture_output=True, text=True,
      timeout=300)
  text = out.read_text()
  rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
          if line.startswith("| 2 |")]
  assert len(rows) == 1, rows
  row = rows[0]
  for i in (1, 2):
    kernels, copies, mb = re.fullmatch(r"(\d+) \((\d+) copies\), ([\d,.]+) MB", row[i]).groups()
    row[i] = (int(kernels), int(copies), float(mb.replace(",", "")))
  return row, text


def test_the_packed_carry_bench_counts_fewer_copies_and_trains_the_same_parameters(tmp_path):
  """Two seeds on one CPU device: the run's chunk programs with the loops' carry packed have
  fewer copies per iteration than with the plain carry (their kernel counts both above zero;
  on the CPU the total can go either way), and train the same parameters."""
  row, _ = _pair_bench_row(tmp_path, "packed_carry")
  (plain, plain_copies, _), (packed, packed_copies, _) = row[1:3]
  assert min(packed, plain) > 0 and packed_copies < plain_copies, row
  assert row[-1] == "yes", row


def test_packed_replay_items_run_fewer_kernels_and_train_the_same_parameters(tmp_path):
  """Two seeds on one CPU device: with the replay's items stored packed the run's chunk programs
  run fewer kernels per iteration than with a leaf per field, and train the same parameters."""
  row, text = _pair_bench_row(tmp_path, "packed_carry", "--what=items")
  (plain, _, _), (packed, _, _) = row[1:3]
  assert 0 < packed < plain, row
  assert row[-1] == "yes" and "replay's items stored packed" in text, row


def test_environment_scatters_as_selects_run_fewer_kernels_and_train_the_same(tmp_path):
  """Two Breakout-MinAtar seeds on one CPU device: with the environment's single-index scatters
  as selects the run's chunk programs run fewer kernels per iteration than with gymnax's
  scatters, and train the same parameters."""
  row, text = _pair_bench_row(tmp_path, "env_selects", "--env=gymnax:Breakout-MinAtar")
  (scatters, _, _), (selects, _, _) = row[1:3]
  assert 0 < selects < scatters, row
  assert row[-1] == "yes" and "Breakout-MinAtar's single-index scatters" in text, row


def test_the_target_update_bench_models_fewer_bytes_in_the_loop_and_trains_the_same(tmp_path):
  """Two seeds on one CPU device: the run's chunk programs with the target update in a loop
  model fewer bytes for a learning iteration with no update due than with the select in every
  step, and train the same parameters (the target moves in the run: every 50 learner steps)."""
  row, text = _pair_bench_row(tmp_path, "target_update")
  (_, _, select_mb), (_, _, loop_mb) = row[1:3]
  assert 0 < loop_mb < select_mb, row
  assert row[-1] == "yes", row
  assert "every 50 learner steps" in text


def test_the_compiler_options_bench_compiles_the_run_chunks_with_each_option_set(tmp_path):
  """Two seeds on one CPU device: the chunk programs with XLA's defaults and with a scheduler
  option, which changes no arithmetic, so both train the same parameters."""
  out = tmp_path / "compiler_options.md"
  subprocess.run(
      [sys.executable, "-m", "bench.compiler_options",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--seed_counts=2",
       "--total_steps=1200", "--min_replay_size=400", "--log_every=400", "--repeats=1",
       "--variants=xla_cpu_enable_concurrency_optimized_scheduler=true", f"--out={out}"],
      cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
  rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.read_text().splitlines()
          if line.startswith("| 2 |")]
  assert [row[1] for row in rows] == [
      "default", "xla_cpu_enable_concurrency_optimized_scheduler=true"], rows
  assert rows[0][5] == "1.00x (1.00-1.00)", rows  # The default over itself.
  assert all(float(row[2]) > 0 and row[6] == "yes" for row in rows), rows


def test_the_fused_loss_bench_trains_the_run_with_both_losses_to_the_same_parameters(tmp_path):
  """One seed on the CPU (the kernel interpreted): the run's programs with XLA's loss and with
  the fused loss at two warp counts and two row blocks (the batch of 128 in one pass, and in
  four), whose parameters end within float rounding of XLA's."""
  out = tmp_path / "fused_loss.md"
  subprocess.run(
      [sys.executable, "-m", "bench.fused_loss",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--seed_counts=1",
       "--total_steps=1200", "--min_replay_size=400", "--log_every=400", "--repeats=1",
       "--num_warps=4,8", "--row_blocks=128,32", f"--out={out}"], cwd=ROOT, check=True,
      capture_output=True, text=True, timeout=300)
  rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.read_text().splitlines()
          if line.startswith("| 1 |")]
  assert len(rows) == 1 and len(rows[0][1].split(",")) == 5, rows  # Five compile times.
  for name in ("4 warps, 128 rows", "4 warps, 32 rows", "8 warps, 128 rows", "8 warps, 32 rows"):
    assert f"fused, {name}: **" in rows[0][3], rows
  drifts = [float(d) for d in rows[0][4].split(",")]
  # Above 0: the fused programs did not run XLA's loss; far below 1: the same training.
  assert len(drifts) == 4 and all(0 < d < 1e-5 for d in drifts), rows
  found = re.search(r"loss (\S+), TD errors (\S+), gradients (\S+)\.", out.read_text())
  assert found and all(float(e) < 1e-5 for e in found.groups()), out.read_text()[-400:]


# A stand-in dqn.py that jit can run: the three lines the loader rewrites, in a loop of
# TOTAL_TIMESTEPS // NUM_ENVS iterations, each one [10, 64] x [64, 64] product.
_JITTABLE_STAND_IN = '''
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Env:
    def step(self, rng, state, action, params):
        return action, action, jnp.sum(action), jnp.bool_(False), jnp.bool_(False), {}


class TrainState(NamedTuple):
    timesteps: jax.Array
    w: jax.Array

    def replace(self, **fields):
        return self._replace(**fields)


def make_train(config):
    env, env_params = Env(), None

    def vmap_step(n):
        return lambda rng, env_state, action: env.step(rng, env_state, action, env_params)

    def train(rng):
        _env_state = jax.random.normal(rng, (config["NUM_ENVS"], 64))
        _action = _env_state
        _obs, _, _reward, _done, _ = env.step(rng, _env_state, _action, env_params)

        def _update_step(carry, _):
            train_state, env_state = carry
            action = env_state @ train_state.w
            obs, env_state, reward, done, info = vmap_step(config["NUM_ENVS"])(
                rng, env_state, action
            )
            train_state = train_state.replace(
                timesteps=train_state.timesteps + config["NUM_ENVS"]
            )
            return (train_state, env_state), done

        start = TrainState(jnp.int32(0), jnp.eye(64) * 0.5)
        return jax.lax.scan(_update_step, (start, _obs), None,
                            config["TOTAL_TIMESTEPS"] // config["NUM_ENVS"])
    return train
'''


def test_the_kernel_times_bench_reads_the_runs_own_kernels_from_a_trace(tmp_path):
  """One seed on the CPU: the trace's thunks, per iteration, ranked by time; the per-op rows
  account for no more than the busy time they are shares of, and each has the bytes its
  program's HLO models. Beside it a stand-in of PureJaxRL's script, whose one product per
  iteration is found with its hand-counted bytes."""
  out = tmp_path / "kernel_times.md"
  checkout = _checkout(tmp_path, _JITTABLE_STAND_IN)
  subprocess.run(
      [sys.executable, "-m", "bench.kernel_times",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--total_steps=1200",
       "--min_replay_size=400", "--log_every=1200", "--top=5", f"--out={out}",
       f"--purejaxrl_dir={checkout}"],
      cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
  text = out.read_text()
  rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
          if line.startswith("| ours | `")]
  assert len(rows) == 5, text[-600:]
  per_iteration = [float(row[4]) for row in rows]
  assert per_iteration == sorted(per_iteration, reverse=True) and per_iteration[-1] > 0, rows
  assert sum(float(row[5].rstrip("%")) for row in rows) <= 100.0, rows
  for row in rows:  # The rate: runs x modelled bytes over the op's time.
    runs, us, megabytes, rate = float(row[2]), float(row[4]), float(row[6]), float(row[7])
    assert megabytes > 0 and rate == pytest.approx(1e3 * runs * megabytes / us, rel=0.05,
                                                   abs=0.11), row
  found = re.search(r"ours \(10 env steps per iteration, 120 iterations, compile [\d.]+ s\): "
                    r"wall ([\d.]+) us untraced .*? device busy ([\d.]+) us .*?, ([\d.]+) "
                    r"kernels;", text)
  assert found, text[-900:]
  wall, busy, kernels = map(float, found.groups())
  # 120 iterations, each at least an env step and an epsilon-greedy forward pass.
  assert wall > 0 and busy > 0 and kernels >= 5, found.groups()
  assert sum(per_iteration) <= busy * 1.001, (per_iteration, busy)
  peer = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
          if line.startswith("| PureJaxRL dqn.py | `")]
  # Its product reads [10, 64] and [64, 64] and writes [10, 64] floats: 21,504 bytes, once in
  # each of its 120 iterations.
  assert any(float(row[2]) == 1 and abs(float(row[6]) * 1e6 - 21_504) < 10 for row in peer), peer
  assert "PureJaxRL dqn.py (10 env steps per iteration, 120 iterations" in text
  assert re.search(r"device busy per iteration, ours / PureJaxRL: [\d.]+x", text), text[-400:]


def test_kernel_times_finds_an_op_in_its_own_module_and_counts_its_runs():
  """Two programs with an op of the same name: each trace op takes its own module's bytes (by
  op alone only where one module has it). An op's runs are the trace's line of ops where it
  has one, else the kernel it launches most often."""
  from bench import trace_ops  # pylint: disable=import-outside-toplevel
  module = lambda name, shape: (f"HloModule {name}\n\nENTRY %main (x: {shape}) -> {shape} {{\n"
                                f"  %x = {shape} parameter(0)\n"
                                f"  ROOT %copy.1 = {shape} copy(%x)\n}}\n")
  bytes_of = trace_ops.modelled_bytes([module("small", "f32[4]{0}"),
                                       module("big", "f32[64]{0}")])
  assert (bytes_of("small", "copy.1"), bytes_of("big", "copy.1")) == (32, 512)
  assert bytes_of("", "copy.1") is None and bytes_of("other", "copy.2") is None
  assert trace_ops.modelled_bytes([module("small", "f32[4]{0}")])("", "copy.1") == 32
  Kernel = trace_ops.Kernel
  events = [Kernel("big", "copy.1", "copy_kernel", 2e-6)] * 4 + [
      Kernel("big", "sort.3", "pass_a", 1e-6), Kernel("big", "sort.3", "pass_a", 1e-6),
      Kernel("big", "sort.3", "pass_b", 1e-6)]
  # Over 2 iterations: copy.1 ran 4 times; sort.3 ran once, launching pass_a twice.
  times = {t.op: t for t in trace_ops.op_times(events, 2, bytes_of)}
  assert (times["copy.1"].runs, times["copy.1"].us, times["copy.1"].bytes) == (2, 4.0, 512)
  assert (times["sort.3"].runs, times["sort.3"].kernels) == (1, 1.5)  # Counted by pass_a.
  times = {t.op: t for t in trace_ops.op_times(events, 2, bytes_of, {("", "sort.3"): 1})}
  assert (times["sort.3"].runs, times["copy.1"].runs) == (0.5, 2)
  assert [t.op for t in trace_ops.op_times(events, 2, bytes_of)] == ["copy.1", "sort.3"]


def test_compiler_option_sets_parse_into_bools_and_text():
  from bench import anakin_programs  # pylint: disable=import-outside-toplevel
  assert anakin_programs.parse_options("a=1 b=true;c=FUSION,WHILE  d=x ;") == {
      "a=1 b=true": {"a": "1", "b": True}, "c=FUSION,WHILE  d=x": {"c": "FUSION,WHILE", "d": "x"}}
  for bad, named in (("a=1;a=1", "'a=1' is given twice"), ("a=1 a=2", "'a' is set twice"),
                     ("=1", "'=1' is not name=value")):
    with pytest.raises(ValueError, match=named):
      anakin_programs.parse_options(bad)


def test_the_compile_time_bench_times_three_schedules_of_the_run_dqn_build(tmp_path):
  """Two seeds on one CPU device, learning starting inside the first of three chunks: two
  chunk programs, built with one compile at a time, two at a time and side by side."""
  out = tmp_path / "compile_time.md"
  subprocess.run(
      [sys.executable, "-m", "bench.compile_time",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--num_seeds=2",
       "--cpu_devices=1", "--total_steps=1200", "--min_replay_size=200", "--log_every=400",
       "--repeats=1", f"--out={out}"], cwd=ROOT, check=True, capture_output=True, text=True,
      timeout=300)
  rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
          if line.startswith("| ours |")]
  assert [[c.strip() for c in row[:4]] for row in rows] == [
      ["ours", "2", "2", "one at a time"], ["ours", "2", "2", "two at a time"],
      ["ours", "2", "2", "side by side"]], rows
  assert all(float(row[4]) > 0 for row in rows), rows


@pytest.mark.parametrize("bench, args, expected", [
    ("compile_time", ["--repeats=0"], "--repeats=0: at least 1 timed pair is needed."),
    ("compile_time", ["--run_mode=local"], "--run_mode=local: this bench times anakin mode"),
    ("compile_time", ["--purejaxrl_dir=/nonexistent"],
     "--purejaxrl_dir='/nonexistent': no purejaxrl/dqn.py"),
    ("warmup_loops", ["--repeats=0"], "--repeats=0: at least 1 timed pair is needed."),
    ("warmup_loops", ["--seed_counts=0"], "--seed_counts=0: give counts of 1 or more."),
    ("warmup_loops", ["--seed_counts=1,x"], "--seed_counts=1,x: give counts of 1 or more."),
    ("warmup_loops", ["--pqn"], "--pqn: PQN learns every iteration and has no warm-up"),
    ("packed_carry", ["--repeats=0"], "--repeats=0: at least 1 timed pair is needed."),
    ("packed_carry", ["--seed_counts=two"], "--seed_counts=two: give counts of 1 or more."),
    ("target_update", ["--repeats=0"], "--repeats=0: at least 1 timed pair is needed."),
    ("compiler_options", ["--variants="], "--variants is empty: give at least one option set"),
    ("compiler_options", ["--variants=novalue"], "--variants: 'novalue' is not name=value"),
    ("compiler_options", ["--variants=xla_cpu_no_such_option=1"],
     "--variants: XLA refused 'xla_cpu_no_such_option=1'"),
    ("compiler_options", ["--variants=xla_cpu_multi_thread_eigen=maybe"],
     "give a value of the option's type"),
    ("compiler_options", ["--variants=a=1;a=1"], "--variants: 'a=1' is given twice"),
    ("compiler_options", ["--seed_counts=0", "--variants=a=1"],
     "--seed_counts=0: give counts of 1 or more."),
    ("compiler_options", ["--seed_counts=two", "--variants=a=1"],
     "--seed_counts=two: give counts of 1 or more."),
    # The project's environment has no JAX CUDA plugin (only a side virtualenv for
    # bench/hlo_kernels.py --target=h200 has one), so this bench finds no GPU compiler.
    ("hlo_kernels", ["--target=h200"], "--target=h200: no GPU compiler here"),
    ("hlo_kernels", ["--target=h200", "--prioritized"],
     "--target=h200 with --prioritized: flashbax builds prioritized replay"),
    ("hlo_kernels", ["--scan_unroll=0"], "error: --scan_unroll=0: must be at least 1."),
    ("hlo_kernels", ["--acting_apart=yes"], "--acting_apart=yes: one seed on the CPU decides"),
    ("hlo_kernels", ["--xla_options=xla_cpu_no_such_option=1"],
     "--xla_options: XLA refused 'xla_cpu_no_such_option=1'"),
    ("hlo_kernels", ["--xla_options=a=1;b=2"], "--xla_options takes one option set (no ';')"),
    ("hlo_kernels", ["--xla_options=novalue"], "--xla_options: 'novalue' is not name=value"),
    ("fused_loss", ["--num_warps=0"], "--num_warps=0: give whole numbers of 1 or more."),
    ("fused_loss", ["--row_blocks=48"], "--row_blocks=48: give powers of two of 16 or more"),
    ("fused_loss", ["--row_blocks=8"], "--row_blocks=8: give powers of two of 16 or more"),
    ("fused_loss", ["--num_warps=8,8"], "a kernel is given twice"),
    # 256 rows hold the batch of 128 in one block, as 128 do.
    ("fused_loss", ["--row_blocks=128,256"], "a kernel is given twice (row blocks count up to"),
    ("fused_loss", ["--dueling"], "--fused_loss=True: its kernel computes Q-learning"),
    ("fused_loss", ["--env=gymnax:Breakout-MinAtar"], "take a conv torso under --torso=auto"),
    ("fused_kernel_resources", ["--num_warps=3"], "--num_warps=3: give powers of two."),
    ("fused_kernel_resources", ["--row_blocks=48"], "--row_blocks=48: give powers of two of 16"),
    ("anakin_floor", ["--reference", "--double_q"],
     "--reference: the hand-written learner is plain DQN; drop --double_q"),
    ("anakin_floor", ["--reference", "--env=gymnax:Breakout-MinAtar"],
     "--reference: the hand-written learner is an MLP on flat observations"),
    ("kernel_times", ["--top=0"], "--top=0: give a whole number of 1 or more."),
    ("kernel_times", ["--purejaxrl_dir=/nonexistent"],
     "--purejaxrl_dir='/nonexistent': no purejaxrl/dqn.py there"),
    ("kernel_times", ["--purejaxrl_dir=/tmp", "--env=gymnax:Breakout-MinAtar"],
     "PureJaxRL's dqn.py is traced on gymnax:CartPole-v1 only"),
    ("kernel_times", ["--purejaxrl_dir=/tmp", "--num_envs=4"],
     "--purejaxrl_dir with --num_envs=4: PureJaxRL's dqn.py steps 10 envs an iteration"),
])
def test_bad_anakin_bench_input_is_one_line_and_exit_code_2(bench, args, expected):
  result = subprocess.run(
      [sys.executable, "-m", f"bench.{bench}",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert expected in result.stderr.strip().splitlines()[-1]


# A scan over iterations (3 trips) whose body runs a fusion, a copy, a nested loop of 5 trips
# (a fusion and a custom call in its body, a fusion in its condition) and a conditional with
# branches of 2 and 0 kernels; free ops (parameters, tuples, bitcasts) count nothing.
_HLO = """
%inner_body (p: (s32[])) -> (s32[]) {
  %p = (s32[]) parameter(0)
  %a = s32[] fusion(), kind=kLoop, calls=%f
  %b = f32[8]{0} custom-call(), custom_call_target="x"
  ROOT %t = (s32[]) tuple(%a)
}

%inner_cond (p: (s32[])) -> pred[] {
  %p = (s32[]) parameter(0)
  ROOT %c = pred[] fusion(), kind=kLoop, calls=%g
}

%learns (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %x = f32[] fusion(%p), kind=kLoop, calls=%h
  ROOT %y = f32[] fusion(%x), kind=kLoop, calls=%h
}

%skips (p: f32[]) -> f32[] {
  ROOT %p = f32[] parameter(0)
}

%body (p: (s32[], f32[])) -> (s32[], f32[]) {
  %p = (s32[], f32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %f0 = f32[4]{0} fusion(), kind=kLoop, calls=%h
  %c0 = f32[4]{0} copy(%f0)
  %bc = f32[2,2]{1,0} bitcast(%c0)
  %w = (s32[]) while(%i), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"5"}}
  %k = f32[] conditional(%pred, %x, %x), branch_computations={%learns, %skips}
  ROOT %t = (s32[], f32[]) tuple(%i, %k)
}

%cond (p: (s32[], f32[])) -> pred[] {
  %p = (s32[], f32[]) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%g
}

ENTRY %main (a: (s32[], f32[])) -> (s32[], f32[]) {
  %a = (s32[], f32[]) parameter(0)
  ROOT %loop = (s32[], f32[]) while(%a), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""


def test_hlo_kernels_counts_what_one_iteration_runs_in_a_small_hand_counted_module():
  counts = hlo_count.iteration_body(_HLO)
  # Top level of the body: one fusion, one copy (unfused), one loop, one conditional.
  assert (counts["fusion"], counts["unfused"], counts["while"], counts["conditional"]) == (
      1, 1, 1, 1)
  assert counts["copy"] == 1  # The unfused op is a copy.
  # Per iteration: 1 fusion + 1 copy + the loop (5 trips x (2 body + 1 condition) + 1) + the
  # conditional (1 + its branch) + the scan's own condition (1): 2 + 16 + 3 + 1 learning,
  # 2 + 16 + 1 + 1 not.
  assert (counts["per_iteration"], counts["per_iteration_min"]) == (22, 20)
  # The one copy reads and writes f32[4] each iteration: 16 + 16 bytes.
  assert counts["copy_bytes_per_iteration"] == 32
  assert hlo_count.entry_trip_counts(_HLO) == [3]  # The entry's loop; the nested one is not.


_TRAFFIC_HLO = """HloModule traffic

%gather_rows (g.buf: f32[100,4], g.idx: s32[8,1]) -> f32[8,4] {
  %g.buf = f32[100,4]{1,0} parameter(0)
  %g.idx = s32[8,1]{1,0} parameter(1)
  ROOT %g.rows = f32[8,4]{1,0} gather(%g.buf, %g.idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}
}

%spread_rows (w.table: f32[2,4], w.idx: s32[8,1]) -> f32[8,4] {
  %w.table = f32[2,4]{1,0} parameter(0)
  %w.idx = s32[8,1]{1,0} parameter(1)
  ROOT %w.rows = f32[8,4]{1,0} gather(%w.table, %w.idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}
}

%insert_rows (u.buf: f32[100,4], u.rows: f32[2,4], u.at: s32[]) -> f32[100,4] {
  %u.buf = f32[100,4]{1,0} parameter(0)
  %u.rows = f32[2,4]{1,0} parameter(1)
  %u.at = s32[] parameter(2)
  %u.zero = s32[] constant(0)
  ROOT %u.new = f32[100,4]{1,0} dynamic-update-slice(%u.buf, %u.rows, %u.at, %u.zero)
}

%two_out (t.p: f32[16], t.q: f32[16]) -> (f32[16], f32[1,4]) {
  %t.p = f32[16]{0} parameter(0)
  %t.q = f32[16]{0} parameter(1)
  %t.sum = f32[16]{0} add(%t.q, %t.q)
  %t.square = f32[4,4]{1,0} bitcast(%t.p)
  %t.row = f32[1,4]{1,0} slice(%t.square), slice={[0:1], [0:4]}
  ROOT %t.out = (f32[16]{0}, f32[1,4]{1,0}) tuple(%t.sum, %t.row)
}

%mixed (m.p: f32[100,4], m.q: f32[16], m.r: s32[], m.unused: f32[2,4]) -> (f32[100,4], f32[16], f32[2]) {
  %m.p = f32[100,4]{1,0} parameter(0)
  %m.q = f32[16]{0} parameter(1)
  %m.r = s32[] parameter(2)
  %m.unused = f32[2,4]{1,0} parameter(3)
  %m.zero = s32[] constant(0)
  %m.row = f32[1,4]{1,0} dynamic-slice(%m.p, %m.r, %m.zero), dynamic_slice_sizes={1,4}
  %m.twice = f32[16]{0} add(%m.q, %m.q)
  %m.head = f32[2]{0} slice(%m.q), slice={[0:2]}
  %m.fill = f32[] constant(0)
  %m.blank = f32[100,4]{1,0} broadcast(%m.fill), dimensions={}
  %m.new = f32[100,4]{1,0} dynamic-update-slice(%m.blank, %m.row, %m.r, %m.zero)
  ROOT %m.out = (f32[100,4]{1,0}, f32[16]{0}, f32[2]{0}) tuple(%m.new, %m.twice, %m.head)
}

%as_square (v.x: f32[16]) -> f32[4,4] {
  %v.x = f32[16]{0} parameter(0)
  ROOT %v.square = f32[4,4]{1,0} bitcast(%v.x)
}

%sum (a.x: f32[], a.y: f32[]) -> f32[] {
  %a.x = f32[] parameter(0)
  %a.y = f32[] parameter(1)
  ROOT %a.s = f32[] add(%a.x, %a.y)
}

%scatter_rows (s.buf: f32[100,4], s.idx: s32[8,1], s.rows: f32[8,4]) -> f32[100,4] {
  %s.buf = f32[100,4]{1,0} parameter(0)
  %s.idx = s32[8,1]{1,0} parameter(1)
  %s.rows = f32[8,4]{1,0} parameter(2)
  ROOT %s.new = f32[100,4]{1,0} scatter(%s.buf, %s.idx, %s.rows), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%sum
}

%less (l.at: s32[]) -> pred[] {
  %l.at = s32[] parameter(0)
  %l.ten = s32[] constant(10)
  ROOT %l.lt = pred[] compare(%l.at, %l.ten), direction=LT
}

%first_positive (f.x: f32[16]) -> pred[] {
  %f.x = f32[16]{0} parameter(0)
  %f.head = f32[1]{0} slice(%f.x), slice={[0:1]}
  %f.scalar = f32[] reshape(%f.head)
  %f.zero = f32[] constant(0)
  ROOT %f.gt = pred[] compare(%f.scalar, %f.zero), direction=GT
}

%inner_body (i.state: (f32[16])) -> (f32[16]) {
  %i.state = (f32[16]{0}) parameter(0)
  %i.x = f32[16]{0} get-tuple-element(%i.state), index=0
  %i.copy = f32[16]{0} copy(%i.x)
  ROOT %i.next = (f32[16]{0}) tuple(%i.copy)
}

%inner_cond (c2.state: (f32[16])) -> pred[] {
  %c2.state = (f32[16]{0}) parameter(0)
  %c2.x = f32[16]{0} get-tuple-element(%c2.state), index=0
  ROOT %c2.go = pred[] fusion(%c2.x), kind=kLoop, calls=%first_positive
}

%heavy (h.x: f32[16]) -> f32[16] {
  %h.x = f32[16]{0} parameter(0)
  %h.one = f32[16]{0} copy(%h.x)
  ROOT %h.two = f32[16]{0} copy(%h.one)
}

%light (k.x: f32[16]) -> f32[16] {
  %k.x = f32[16]{0} parameter(0)
  ROOT %k.one = f32[16]{0} copy(%k.x)
}

%body (b.state: (f32[100,4], s32[8,1], f32[2,4], s32[], f32[16])) -> (f32[100,4], s32[8,1], f32[2,4], s32[], f32[16]) {
  %b.state = (f32[100,4]{1,0}, s32[8,1]{1,0}, f32[2,4]{1,0}, s32[], f32[16]{0}) parameter(0)
  %b.buf = f32[100,4]{1,0} get-tuple-element(%b.state), index=0
  %b.idx = s32[8,1]{1,0} get-tuple-element(%b.state), index=1
  %b.rows = f32[2,4]{1,0} get-tuple-element(%b.state), index=2
  %b.at = s32[] get-tuple-element(%b.state), index=3
  %b.v = f32[16]{0} get-tuple-element(%b.state), index=4
  %b.sample = f32[8,4]{1,0} fusion(%b.buf, %b.idx), kind=kInput, calls=%gather_rows
  %b.new = f32[100,4]{1,0} fusion(%b.buf, %b.rows, %b.at), kind=kLoop, calls=%insert_rows
  %b.copy = f32[16]{0} copy(%b.v)
  %b.two = (f32[16]{0}, f32[1,4]{1,0}) fusion(%b.copy, %b.v), kind=kLoop, calls=%two_out
  %b.mixed = (f32[100,4]{1,0}, f32[16]{0}, f32[2]{0}) fusion(%b.buf, %b.v, %b.at, %b.rows), kind=kLoop, calls=%mixed
  %b.scattered = f32[100,4]{1,0} fusion(%b.new, %b.idx, %b.sample), kind=kInput, calls=%scatter_rows
  %b.square = f32[4,4]{1,0} fusion(%b.v), kind=kLoop, calls=%as_square
  %b.spread = f32[8,4]{1,0} fusion(%b.rows, %b.idx), kind=kInput, calls=%spread_rows
  %b.start = (f32[16]{0}) tuple(%b.v)
  %b.inner = (f32[16]{0}) while(%b.start), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %b.pred = pred[] fusion(%b.at), kind=kLoop, calls=%less
  %b.branch = f32[16]{0} conditional(%b.pred, %b.v, %b.v), branch_computations={%heavy, %light}
  ROOT %b.next = (f32[100,4]{1,0}, s32[8,1]{1,0}, f32[2,4]{1,0}, s32[], f32[16]{0}) tuple(%b.scattered, %b.idx, %b.rows, %b.at, %b.branch)
}

%cond (c.state: (f32[100,4], s32[8,1], f32[2,4], s32[], f32[16])) -> pred[] {
  %c.state = (f32[100,4]{1,0}, s32[8,1]{1,0}, f32[2,4]{1,0}, s32[], f32[16]{0}) parameter(0)
  %c.at = s32[] get-tuple-element(%c.state), index=3
  ROOT %c.lt = pred[] fusion(%c.at), kind=kLoop, calls=%less
}

ENTRY %main (m.state: (f32[100,4], s32[8,1], f32[2,4], s32[], f32[16])) -> (f32[100,4], s32[8,1], f32[2,4], s32[], f32[16]) {
  %m.state = (f32[100,4]{1,0}, s32[8,1]{1,0}, f32[2,4]{1,0}, s32[], f32[16]{0}) parameter(0)
  ROOT %m.loop = (f32[100,4]{1,0}, s32[8,1]{1,0}, f32[2,4]{1,0}, s32[], f32[16]{0}) while(%m.state), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
}
"""


def test_hlo_count_models_the_bytes_an_iteration_reads_and_writes_in_a_hand_counted_module():
  assert hlo_count.shape_bytes(
      "(f32[2,3]{1,0}, pred[4], bf16[8], s32[], f8e4m3fn[10], s4[3])") == 24 + 4 + 16 + 4 + 10 + 2
  counts = hlo_count.iteration_body(_TRAFFIC_HLO)
  # Kernels: 2 gathers, update, copy, two-output fusion, mixed fusion, scatter, view, the nested loop
  # (3 trips x (copy + test) + 1), the predicate, the conditional (1 + its branch: 2 or 1),
  # the loop's test.
  assert (counts["per_iteration"], counts["per_iteration_min"]) == (
      8 + 7 + 1 + 3 + 1, 8 + 7 + 1 + 2 + 1)
  # Bytes. The gather reads the 8 rows it takes (128, not the buffer's 1,600) and its indices
  # (32), and writes 128. The in-place update reads and writes only its 2 rows (32 each) and
  # reads its offset (4). The copy reads and writes 64. The two-output fusion reads all of one
  # operand (64) but one row of the other, through a view (16), and writes 64 + 16. The mixed
  # fusion reads one row of the buffer (16), all of the vector it also slices (64), the offset
  # (4) and nothing of its unused operand, and writes a whole buffer (1,600: the update goes
  # into a buffer made inside the kernel, not in place), 64 and 8. The scatter reads its
  # indices and rows (32 + 128) and writes the rows in place (128). A kernel whose result is a
  # view of its operand reads and writes all of it (64 each). A gather that takes 8 rows of a
  # 2-row table reads the table once (32), at most all of it. The nested loop runs a
  # copy (128) and a test that reads one element (4) and writes 1, 3 times. The predicate
  # and the loop's test read 4 and write 1 each. The conditional's branches copy twice (256)
  # or once (128).
  fixed = ((128 + 32 + 128) + (32 + 4 + 32) + (64 + 64) + (64 + 16 + 64 + 16)
           + (16 + 64 + 4 + 1600 + 64 + 8) + (32 + 128 + 128) + (64 + 64) + (32 + 32 + 128)
           + 3 * (128 + 4 + 1)
           + (4 + 1) + (4 + 1))
  assert (counts["bytes_per_iteration"], counts["bytes_per_iteration_min"]) == (
      fixed + 256, fixed + 128)
  # Kernel by kernel, as a trace names them: loops and conditionals are not kernels, nor are
  # the instructions inside a fusion (`g.` in the gather's body).
  ops = hlo_count.op_bytes(_TRAFFIC_HLO)
  assert hlo_count.module_name(_TRAFFIC_HLO) == "traffic"
  assert (ops["b.sample"], ops["b.new"], ops["b.mixed"], ops["h.two"], ops["k.one"]) == (
      128 + 32 + 128, 32 + 4 + 32, 16 + 64 + 4 + 1600 + 64 + 8, 128, 64 + 64)
  assert not {"b.inner", "b.branch", "m.loop"} & set(ops)
  assert not [op for op in ops if op.startswith("g.")], ops
  # Listed kernel by kernel, as `bytes_per_iteration` counts them: the nested loop's copy 3
  # times, the heavier branch's two copies and not the lighter one's.
  listing = []
  assert hlo_count.iteration_body(_TRAFFIC_HLO, listing) == counts
  assert sum(bytes_ * runs for _, bytes_, runs in listing) == fixed + 256
  runs = {hlo_count.parts(line)[0].split()[-1].lstrip("%"): n for line, _, n in listing}
  assert (runs["i.copy"], runs["h.one"], runs["h.two"], "k.one" in runs) == (3, 1, 1, False)
  top = hlo_count.top_kernels(listing, 1, per_step=2)
  assert [(k["name"], k["op"], k["runs"]) for k in top] == [("b.mixed", "fusion kLoop", 0.5)]
  assert top[0]["mb_per_run"] * 1e6 == pytest.approx(16 + 64 + 4 + 1600 + 64 + 8)
  assert top[0]["share"] == pytest.approx((16 + 64 + 4 + 1600 + 64 + 8) / (fixed + 256))


# A scan (4 trips) whose body runs a copy and a loop whose trip count XLA does not know (a
# copy in its body, a test in its condition), as the target update in a loop compiles.
_DUE_HLO = """HloModule due

%due_body (d.state: (pred[], f32[16])) -> (pred[], f32[16]) {
  %d.state = (pred[], f32[16]{0}) parameter(0)
  %d.v = f32[16]{0} get-tuple-element(%d.state), index=1
  %d.moved = f32[16]{0} copy(%d.v)
  %d.no = pred[] constant(false)
  ROOT %d.next = (pred[], f32[16]{0}) tuple(%d.no, %d.moved)
}

%due_cond (e.state: (pred[], f32[16])) -> pred[] {
  %e.state = (pred[], f32[16]{0}) parameter(0)
  %e.p = pred[] get-tuple-element(%e.state), index=0
  ROOT %e.test = pred[] fusion(%e.p), kind=kLoop, calls=%same
}

%body (b.state: (s32[], f32[16])) -> (s32[], f32[16]) {
  %b.state = (s32[], f32[16]{0}) parameter(0)
  %b.i = s32[] get-tuple-element(%b.state), index=0
  %b.v = f32[16]{0} get-tuple-element(%b.state), index=1
  %b.copy = f32[16]{0} copy(%b.v)
  %b.p = pred[] fusion(%b.i), kind=kLoop, calls=%less
  %b.start = (pred[], f32[16]{0}) tuple(%b.p, %b.copy)
  %b.due = (pred[], f32[16]{0}) while(%b.start), condition=%due_cond, body=%due_body
  %b.out = f32[16]{0} get-tuple-element(%b.due), index=1
  ROOT %b.next = (s32[], f32[16]{0}) tuple(%b.i, %b.out)
}

%cond (c.state: (s32[], f32[16])) -> pred[] {
  %c.state = (s32[], f32[16]{0}) parameter(0)
  %c.i = s32[] get-tuple-element(%c.state), index=0
  ROOT %c.lt = pred[] fusion(%c.i), kind=kLoop, calls=%less
}

ENTRY %main (m.state: (s32[], f32[16])) -> (s32[], f32[16]) {
  %m.state = (s32[], f32[16]{0}) parameter(0)
  ROOT %m.loop = (s32[], f32[16]{0}) while(%m.state), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
}
"""


def test_hlo_count_runs_a_loop_of_unknown_trip_count_once_and_not_where_no_update_is_due():
  counts = hlo_count.iteration_body(_DUE_HLO)
  # Each iteration: the copy (64 + 64), the predicate (4 + 1), the loop's test (1 + 1) and the
  # scan's test (4 + 1); the loop's body, a copy (64 + 64), once where an update is due.
  not_due = (64 + 64) + (4 + 1) + (1 + 1) + (4 + 1)
  assert counts["bytes_per_iteration_not_due"] == not_due
  assert counts["bytes_per_iteration"] == not_due + 128
  assert counts["copy_bytes_per_iteration"] == 128 + 128
  # Kernels: copy, predicate, the loop (one trip: body copy + test, + 1), the scan's test.
  assert counts["per_iteration"] == 2 + 3 + 1
  listing = []  # The loop of unknown trips listed once, as `bytes_per_iteration` counts it.
  hlo_count.iteration_body(_DUE_HLO, listing)
  assert sum(bytes_ * runs for _, bytes_, runs in listing) == not_due + 128
  assert [(hlo_count.parts(line)[0].split()[-1].lstrip("%"), runs)
          for line, _, runs in listing] == [("b.copy", 1), ("b.p", 1), ("d.moved", 1),
                                            ("e.test", 1), ("c.lt", 1)]


@pytest.mark.parametrize("num_seeds, unroll, conditionals", [(1, 1, 1), (2, 1, 0), (1, 2, 2)])
def test_hlo_kernels_counts_the_chunk_structure_a_run_compiles(tmp_path, num_seeds, unroll,
                                                                conditionals):
  """One seed on the CPU: one program whose conditional decides whether an iteration learns.
  Two seeds on one device: the warm-up is a loop of its own, counted from a second program,
  and the learning loop has no conditional. With --scan_unroll=2 a loop step holds two
  iterations (two conditionals), and the counts per iteration are half a step's."""
  out = tmp_path / "hlo.md"
  result = subprocess.run(
      [sys.executable, "-m", "bench.hlo_kernels",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", f"--num_seeds={num_seeds}",
       "--iterations=2", f"--scan_unroll={unroll}", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
  (name, counts), = json.loads(result.stdout.strip().splitlines()[-1]).items()
  assert counts.get("conditional", 0) == conditionals, counts
  assert counts["per_iteration"] > counts["per_iteration_min"] > 0, counts
  # 10 env steps per iteration, all learning.
  assert counts["per_1000_steps"] == round(counts["per_iteration"] * 100)
  assert f"{num_seeds} seed" in out.read_text()
  assert ("--scan_unroll=2" in name) == (unroll == 2)
  assert ("a loop step (2 iterations)" in out.read_text()) == (unroll == 2)


def test_hlo_kernels_compiles_our_programs_with_the_xla_options_given(tmp_path):
  """--xla_options reaches our programs' compile: with XLA's fusion pass off the same chunk
  runs several times the kernels, and the row names the options."""
  counts = {}
  for options in ([], ["--xla_options=xla_disable_hlo_passes=fusion"]):
    result = subprocess.run(
        [sys.executable, "-m", "bench.hlo_kernels",
         "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg", "--num_seeds=2",
         "--iterations=2", "--out=", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    (name, row), = json.loads(result.stdout.strip().splitlines()[-1]).items()
    counts[bool(options)] = row["per_iteration"]
    assert ("--xla_options=xla_disable_hlo_passes=fusion" in name) == bool(options)
  assert counts[True] > 2 * counts[False], counts


def test_gpu_all_bundles_tables_logs_and_summaries_but_not_checkpoints(tmp_path):
  """BUNDLE packs the reader's files under OUT (tables, step outputs, the log, the runs'
  summary.json) into one .tar.gz, which a host that hands back few files returns whole; the
  runs' checkpoints stay out. No step runs here (STEPS names none)."""
  import tarfile  # pylint: disable=import-outside-toplevel
  out = tmp_path / "out"
  (out / "runs_default" / "cartpole_1_0" / "checkpoints" / "100").mkdir(parents=True)
  (out / "gpu_speed.md").write_text("| table |\n")
  (out / "gpu_speed.txt").write_text("a step's output\n")
  (out / "runs_default" / "cartpole_1_0" / "summary.json").write_text("{}\n")
  (out / "runs_default" / "cartpole_1_0" / "checkpoints" / "100" / "params").write_bytes(
      b"\0" * 1024)
  bundle = tmp_path / "back" / "gpu_all.tar.gz"
  env = {**os.environ, "OUT": str(out), "BUNDLE": os.path.relpath(bundle, ROOT),
         "STEPS": "no_such_step", "WHEELS": "0", "PUREJAXRL_DIR": str(tmp_path / "none")}
  subprocess.run(["bash", "bench/gpu_all.sh"], cwd=ROOT, env=env, check=True,
                 capture_output=True, timeout=60)
  with tarfile.open(bundle) as tar:
    names = sorted(os.path.normpath(n) for n in tar.getnames() if not n.endswith("/")
                   and tar.getmember(n).isfile())
    log = tar.extractfile("./log.txt").read().decode()
  assert names == ["gpu_speed.md", "gpu_speed.txt", "log.txt",
                   os.path.join("runs_default", "cartpole_1_0", "summary.json")], names
  assert "no PureJaxRL checkout" in log and "== done at" in log
  assert not os.path.exists(f"{bundle}.part")


def test_fused_kernel_resources_without_triton_is_one_line_and_exit_code_2(tmp_path):
  """A `triton` that cannot be imported (a stand-in package that raises, as where none is
  installed) gets one line naming the virtualenv that has it, before anything compiles."""
  (tmp_path / "triton").mkdir()
  (tmp_path / "triton" / "__init__.py").write_text("raise ImportError('no triton')\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
  result = subprocess.run(
      [sys.executable, "-m", "bench.fused_kernel_resources",
       "--flagfile=launch/configs/cartpole_anakin_purejaxrl.cfg"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-400:]
  assert "no `triton` package here: bench/jax_0112_venv.sh makes" in result.stderr, result.stderr


@pytest.mark.parametrize("args, expected", [
    (["--network=4/120,84/2", "--network=4/120/x"],
     "--network=4/120,84/2 --network=4/120/x: give inputs/hidden/actions"),
    (["--batch_sizes=0"], "--batch_sizes=0: give positive integers."),
    (["--double_q=maybe"], "--double_q=maybe: give false, true or both."),
    # The project's environment has no JAX CUDA plugin: no compiler for the H200 here.
    ([], "--target=h200: no GPU compiler here"),
])
def test_fused_kernel_fits_bad_input_is_one_line_and_exit_code_2(args, expected):
  result = subprocess.run([sys.executable, "-m", "bench.fused_kernel_fits", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-400:]
  assert expected in result.stderr.strip().splitlines()[-1]


def test_fused_kernel_fits_reads_networks_and_xlas_thunk_sequence(tmp_path):
  from bench import gpu_target  # pylint: disable=import-outside-toplevel
  assert gpu_target.parse_networks(["4/120,84/2", "128/128/16"]) == [
      (4, (120, 84), 2), (128, (128,), 16)]
  assert gpu_target.parse_networks(["4/2"]) is None
  assert gpu_target.parse_networks(["4/,/2"]) is None
  (tmp_path / "module_0001.jit__lambda.thunk_sequence.txt").write_text(
      "000: kCopy [source | sink] something\n"
      "001: kCustomKernel [source | sink] fused_q_learning_loss grid: [1, 1, 1] threads: "
      "[256, 1, 1]  shared_memory: 73728 bytes\n")
  assert gpu_target.thunk_shared_bytes(str(tmp_path), "fused_q_learning_loss") == 73728
  with pytest.raises(ValueError, match="no other kernel"):
    gpu_target.thunk_shared_bytes(str(tmp_path), "other")


def test_programs_per_sm_takes_the_scarcest_of_registers_shared_memory_and_warps():
  """Hand-counted for an SM of 65,536 registers, 228 KiB of shared memory and 64 warps."""
  from bench import gpu_target  # pylint: disable=import-outside-toplevel
  # 255 registers round up to 256 a thread: 8,192 a warp, 8 warps take all 65,536.
  assert gpu_target.programs_per_sm(255, 128 * 1024, 8) == 1
  # 4 warps take 32,768 registers: two programs, and 2 x 80 KiB of shared memory fit.
  assert gpu_target.programs_per_sm(255, 80 * 1024, 4) == 2
  # Few registers: shared memory limits (228 // 64 = 3), then warps (64 // 16 = 4).
  assert gpu_target.programs_per_sm(32, 64 * 1024, 4) == 3
  assert gpu_target.programs_per_sm(32, 1024, 16) == 4
  # 130 registers round up to 136 (units of 256 a warp): 4,352 a warp, 15 warps' worth.
  assert gpu_target.programs_per_sm(130, 1024, 1) == 15


def test_triton_module_takes_the_module_out_of_pallas_debug_print():
  """What `pallas_call(debug=True)` prints: the kernel's jaxpr, then the module with location
  annotations and `#loc` lines, which MLIR's parser does not read."""
  from bench import gpu_target  # pylint: disable=import-outside-toplevel
  printed = (
      "The kernel jaxpr for pallas_call k:\n{ lambda ; a:f32[]. let  in () }\n"
      "The Triton module for pallas_call k:\n"
      "module @k {\n"
      "  tt.func public @k(%arg0: !tt.ptr<f32> {tt.divisibility = 32 : i32} [unknown]) {\n"
      '    %c0 = arith.constant 0 : i32 "masked_load:"(#loc3)\n'
      "    %1 = arith.addi %c0, %c0 : i32 loc(#loc4)\n"
      "    tt.return [unknown]\n"
      "  }\n"
      "}\n"
      "#loc3 = /work/kernel.py:1:2 to :3\n"
      " at #loc3\n")
  assert gpu_target.triton_module(printed) == (
      "module @k {\n"
      "  tt.func public @k(%arg0: !tt.ptr<f32> {tt.divisibility = 32 : i32}) {\n"
      "    %c0 = arith.constant 0 : i32\n"
      "    %1 = arith.addi %c0, %c0 : i32\n"
      "    tt.return\n"
      "  }\n"
      "}\n")
