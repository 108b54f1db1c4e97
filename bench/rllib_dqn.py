"""RLlib's DQN on CartPole-v1: the kit's JAX module and learner beside RLlib's own torch DQN.

  python bench/rllib_dqn.py --seeds=0,1 [--torch_python=/path/to/venv/bin/python]

Both run RLlib's DQN algorithm (its env runners, prioritized episode
replay, n-step sampling and training loop) with the same settings; they
differ in the RLModule and Learner: `agents.rllib_dqn.JaxDQNConfig` (JAX,
no torch) against `ray.rllib.algorithms.dqn.DQNConfig` (torch). Each run
is its own process, trains until RLlib's `episode_return_mean` (the last
100 training episodes, epsilon-greedy) reaches --target or --max_steps
env steps pass, then evaluates the greedy policy for 10 episodes. The
torch baseline needs torch; --torch_python names an interpreter that has
it (a venv made with --system-site-packages, then `pip install
torch==2.13.0`), so the kit's own environment stays free of torch.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For `bench`.
from bench import harness  # pylint: disable=wrong-import-position

flags.DEFINE_list("seeds", ["0"], "Seeds; every seed runs both programs.")
flags.DEFINE_list("frameworks", ["jax", "torch"], "jax: the kit's module and learner; "
                  "torch: RLlib's own DQN.")
flags.DEFINE_string("torch_python", "", "Python with torch for the torch baseline (default: "
                    "this one, which must then have torch).")
flags.DEFINE_float("target", 450.0, "Training return mean (last 100 episodes) that stops a run.")
flags.DEFINE_integer("max_steps", 100_000, "Env steps a run may take at most.")
flags.DEFINE_integer("num_env_runners", 0, "RLlib env runners (0: sample in the driver).")
flags.DEFINE_string("out", "bench/results/rllib_dqn.md", "Markdown table to write.")
flags.DEFINE_string("worker", "", "Internal: run one framework in this process.")
flags.DEFINE_integer("seed", 0, "Internal: the worker's seed.")
FLAGS = flags.FLAGS

SETTINGS = dict(lr=5e-4, train_batch_size_per_learner=32, n_step=3, double_q=True,
                dueling=True, target_network_update_freq=500, tau=1.0,
                td_error_loss_fn="huber", num_steps_sampled_before_learning_starts=1000,
                epsilon=[(0, 1.0), (10_000, 0.02)])
MODEL = {"fcnet_hiddens": [256], "head_fcnet_hiddens": [256], "hiddens": [256]}


def _config(framework: str, seed: int):
  if framework == "jax":
    from agents.rllib_dqn import JaxDQNConfig  # pylint: disable=import-outside-toplevel
    config = JaxDQNConfig()
  else:
    from ray.rllib.algorithms.dqn import DQNConfig  # pylint: disable=import-outside-toplevel
    config = DQNConfig().framework("torch")
  return (config.environment("CartPole-v1")
          .env_runners(num_env_runners=FLAGS.num_env_runners)
          .reporting(min_sample_timesteps_per_iteration=1000)
          .training(**SETTINGS)
          .rl_module(model_config={**MODEL, "seed": seed})
          .debugging(seed=seed))


def _greedy_return(algo, episodes: int = 10) -> float:
  import gymnasium as gym  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  module = algo.get_module()
  env, returns = gym.make("CartPole-v1"), []
  for episode in range(episodes):
    observation, _ = env.reset(seed=10_000 + episode)
    done, total = False, 0.0
    while not done:
      batch = {"obs": np.asarray(observation, np.float32)[None]}
      if hasattr(module, "compute_q_values") and module.framework == "jax":
        action = int(module.compute_q_values(batch)["qf_preds"][0].argmax())
      else:
        import torch  # pylint: disable=import-outside-toplevel,redefined-outer-name
        with torch.no_grad():
          out = module.forward_inference({"obs": torch.as_tensor(batch["obs"])})
        action = int(out["actions"][0]) if "actions" in out else int(
            out["action_dist_inputs"][0].argmax())
      observation, reward, terminated, truncated, _ = env.step(action)
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  return float(np.mean(returns))


def worker(framework: str, seed: int) -> dict:
  import ray  # pylint: disable=import-outside-toplevel
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  start = time.perf_counter()
  algo = _config(framework, seed).build_algo()
  build_s = time.perf_counter() - start
  steps, best, solved_at, solved_s = 0, float("-inf"), None, None
  while steps < FLAGS.max_steps:
    result = algo.train()
    runners = result["env_runners"]
    steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
    mean = float(runners.get("episode_return_mean", float("nan")))
    best = max(best, mean) if mean == mean else best
    if mean >= FLAGS.target:
      solved_at, solved_s = steps, time.perf_counter() - start
      break
  wall_s = time.perf_counter() - start
  greedy = _greedy_return(algo)
  algo.stop()
  ray.shutdown()
  return {"framework": framework, "seed": seed, "env_steps": steps, "solved_at": solved_at,
          "solved_s": solved_s, "wall_s": wall_s, "build_s": build_s, "best_mean": best,
          "greedy_return": greedy, "sps": steps / wall_s}


def _run(framework: str, seed: str) -> dict:
  python = FLAGS.torch_python if framework == "torch" and FLAGS.torch_python else sys.executable
  cmd = [python, os.path.abspath(__file__), f"--worker={framework}", f"--seed={seed}",
         f"--target={FLAGS.target}", f"--max_steps={FLAGS.max_steps}",
         f"--num_env_runners={FLAGS.num_env_runners}"]
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=harness.ROOT)
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode or not lines:
    raise SystemExit(f"{framework} seed {seed} failed:\n{done.stderr[-3000:]}")
  return json.loads(lines[-1])


def main(argv):
  del argv
  if FLAGS.worker:
    print(json.dumps(worker(FLAGS.worker, FLAGS.seed)))
    return
  if "torch" in FLAGS.frameworks and not FLAGS.torch_python:
    if importlib.util.find_spec("torch") is None:
      raise SystemExit("--frameworks=torch needs torch: make a venv with "
                       "--system-site-packages, `pip install torch==2.13.0` in it, and pass "
                       "its python as --torch_python.")
  rows = []
  for seed in FLAGS.seeds:
    for framework in FLAGS.frameworks:  # Alternating, in one sitting.
      result = _run(framework, seed)
      print(json.dumps(result), flush=True)
      rows.append(result)
  header = ["module and learner", "seed", "env steps to a training mean of "
            f"{FLAGS.target:g}", "wall s to it (build incl.)", "env steps run", "wall s",
            "env steps/s", "greedy return (10 ep)"]
  names = {"jax": "kit's JAX (agents.rllib_dqn)", "torch": "RLlib's torch DQN"}
  table = ["| " + " | ".join(str(x) for x in [
      names[r["framework"]], r["seed"],
      r["solved_at"] if r["solved_at"] is not None else f"not in {r['env_steps']}",
      f"{r['solved_s']:.1f}" if r["solved_s"] is not None else "",
      r["env_steps"], f"{r['wall_s']:.1f}", f"{r['sps']:.0f}",
      f"{r['greedy_return']:.1f}"]) + " |" for r in rows]
  settings = ", ".join(f"{k}={v}" for k, v in {**SETTINGS, **MODEL}.items())
  ratios = []
  if set(FLAGS.frameworks) == {"jax", "torch"}:
    mean = lambda key, fw: sum(r[key] for r in rows if r["framework"] == fw) / len(FLAGS.seeds)
    ratios.append(f"ratio, kit's JAX over RLlib's torch (means over seeds): env steps/s "
                  f"{mean('sps', 'jax') / mean('sps', 'torch'):.2f}x; wall s of the runs "
                  f"{mean('wall_s', 'jax') / mean('wall_s', 'torch'):.2f}x.")
    print(ratios[0])
  compared = (" against RLlib's torch DQN, same settings, one process each, alternating"
              if len(FLAGS.frameworks) > 1 else "")
  harness.write_table(FLAGS.out, harness.command_line(), header, table, notes=[*ratios,
      "compared: RLlib's DQN on gymnasium CartPole-v1 with the kit's JAX RLModule and Learner"
      f"{compared}.",
      f"settings: {settings}; replay: RLlib's default PrioritizedEpisodeReplayBuffer; "
      f"num_env_runners={FLAGS.num_env_runners}.",
      "networks: the settings are the same, the networks are not: RLlib's torch module is a "
      "tanh encoder of 256 (RLlib's default fcnet_activation) with a 256-unit layer per "
      "dueling stream; the kit's a shared ReLU torso of 256-256 with linear streams."])
  for framework in FLAGS.frameworks:
    solved = [r["solved_s"] for r in rows if r["framework"] == framework and r["solved_s"]]
    print(f"{names[framework]}: solved {len(solved)}/{len(FLAGS.seeds)}"
          + (f", mean wall {sum(solved) / len(solved):.1f} s" if solved else ""))


if __name__ == "__main__":
  app.run(main)
