"""Compares agents (presets) on one environment with the same seeds; writes a table and a plot.

  python -m launch.experiments.compare_agents --env=gymnasium:CartPole-v1 \
      --agents=dqn,double_dueling,c51,rainbow --seeds=3
  python -m launch.experiments.compare_agents --env=gymnax:CartPole-v1 --run_mode=anakin --seeds=5

Agent NAME runs the preset launch/configs/cartpole_NAME.cfg (--preset_pattern)
with --env overriding the preset's environment. Local mode runs one process
per (agent, seed); anakin mode runs each agent's seeds vmapped in one.
Writes <out>/results.md, <out>/results.csv and <out>/curves.png.
"""

from absl import app
from absl import flags

from launch.cli import parse_flags
from launch.experiments import common

flags.DEFINE_string("env", "gymnasium:CartPole-v1", "Environment for every agent.")
flags.DEFINE_list("agents", ["dqn", "double_dueling", "c51", "rainbow"], "Agents to compare.")
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 for every agent.")
flags.DEFINE_string("preset_pattern", "launch/configs/cartpole_{agent}.cfg", "Flagfile per agent.")
common.define_run_flags("runs/compare_agents")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  results = []
  for agent in FLAGS.agents:
    result = common.run_agent(agent, FLAGS.preset_pattern.format(agent=agent), FLAGS.env,
                              list(range(FLAGS.seeds)), FLAGS.run_mode, FLAGS.out,
                              FLAGS.total_steps, FLAGS.eval_every, FLAGS.extra_flags)
    print(f"{agent}: final eval return per seed {[round(v, 1) for v in result.final]}", flush=True)
    results.append(result)
  command = (f"`python -m launch.experiments.compare_agents --env={FLAGS.env} "
             f"--agents={','.join(FLAGS.agents)} --seeds={FLAGS.seeds} --run_mode={FLAGS.run_mode}`")
  print(common.write_table(results, FLAGS.out, command))
  print(f"plot: {common.plot(results, FLAGS.out, FLAGS.env)}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
