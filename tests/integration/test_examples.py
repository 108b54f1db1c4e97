"""The example scripts run as a user would run them, and do what they say."""

import re
import subprocess
import sys
from tests.fakes import ROOT



def test_embed_custom_loop_learns_the_corridor():
  result = subprocess.run([sys.executable, "examples/embed_custom_loop.py", "--steps=3000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  match = re.search(r"greedy episode: return ([\d.]+) in (\d+) steps", result.stdout)
  assert match, result.stdout
  # A random walk rarely crosses 7 cells in 20 steps; the learned greedy policy goes straight.
  assert float(match.group(1)) == 1.0 and int(match.group(2)) == 7, result.stdout
