"""The distributed program's state: its checkpoints, the learner's snapshots and restarts."""

import time
from typing import Any, Dict, Optional

import jax

from agents.dqn.ray_cluster import NodeCrashed, start_failure

LEARNER_RESTARTS = 3  # Crashes of the learner node a run recovers from.
LEARNER_SNAPSHOT_S = 30.0  # Seconds between learner snapshots kept on the driver.


class ProgramCheckpoints:
  """Saves and restores the distributed program's state through the run's checkpoints.

  A checkpoint holds the learner's TrainingState, the replay items (with
  `checkpoint_replay`; without them a resumed replay refills to
  `min_replay_size` first) and, on the host, the replay's accepted env-step
  counts per actor, its sampling key and rate-limiter counts, the learner
  steps, the evaluations and the restart counts. The counts come from the
  replay's one snapshot, so a resumed run counts every accepted step once.
  The driver also keeps the learner's state every `LEARNER_SNAPSHOT_S`
  seconds (checkpoints on or off); a learner node that crashed continues
  from the newest of these snapshots.
  """

  def __init__(self, ray, experiment, nodes):
    self._ray, self._experiment = ray, experiment
    self.replay, self.learner, self.actors = nodes
    self.learner_snapshot: Optional[Dict[str, Any]] = None
    self.learner_restarts = 0
    self.snapshot_at = time.time()

  def snapshot_learner(self) -> None:
    """Keeps the learner's newest state on the driver (what a restarted learner resumes)."""
    while True:
      try:
        self.learner_snapshot = self._ray.get(self.learner.snapshot.remote())
        self.snapshot_at = time.time()
        return
      except self._ray.exceptions.RayActorError as error:  # Died meanwhile: restart, retry.
        self.recover_learner(error)

  def recover_learner(self, error: Exception) -> None:
    """After the learner process died: Ray restarts it; it continues from the newest snapshot."""
    if self.learner_restarts >= LEARNER_RESTARTS:
      raise NodeCrashed(f"The learner node crashed {self.learner_restarts + 1} times "
                        f"({type(error).__name__}: {str(error).splitlines()[0][:300]}); the "
                        "run stops. See the Ray logs under /tmp/ray/session_latest/logs.")
    self.learner_restarts += 1
    self.restart_learner()

  def checkpoint(self, host: Dict[str, Any]):
    """Snapshots the replay, then the learner: (env steps, arrays, host, meta, params)."""
    ray = self._ray
    with_items = self._experiment.checkpoint_replay and self._experiment.save_checkpoints
    replay_state = ray.get(self.replay.get_state.remote(with_items))
    self.snapshot_learner()
    state = self.learner_snapshot["state"]
    arrays = {"learner": state}
    if "buffer" in replay_state:
      arrays["replay"] = replay_state.pop("buffer")
    learner_steps = self.learner_snapshot["learner_steps"]
    return (sum(replay_state["actor_steps"].values()), arrays,
            {**host, "replay": replay_state, "learner_steps": learner_steps},
            {"learner_steps": learner_steps, "replay_saved": "replay" in arrays,
             "nonfinite_updates": int(state.nonfinite_updates)}, state.online_params)

  def restore(self, run_checkpoints, resumed) -> Dict[str, Any]:
    """Loads what `resume.read_distributed` read (before Ray started) into the nodes; returns
    its host state and env steps."""
    ray = self._ray
    arrays, meta, host = run_checkpoints.adopt(resumed)
    arrays = jax.device_get(arrays)
    replay_state = dict(host["replay"])
    if "replay" in arrays:
      replay_state["buffer"] = arrays["replay"]
    self.learner_snapshot = {"state": arrays["learner"],
                             "learner_steps": host["learner_steps"]}
    ray.get([self.replay.set_state.remote(replay_state),
             self.learner.set_state.remote(arrays["learner"], host["learner_steps"])])
    self.resume_actors(replay_state["actor_steps"])
    return {**host, "env_steps": int(meta["env_steps"])}

  def resume_actors(self, actor_steps: Dict[int, int], only: Optional[int] = None) -> None:
    """Actors continue their epsilon schedules from their counted env steps."""
    for i, actor in enumerate(self.actors):
      if only is None or i == only:
        actor.set_steps.remote(int(actor_steps.get(i, 0)))

  def restart_learner(self, timeout_s: float = 300.0) -> None:
    """Waits for Ray to restart the learner node, which continues from the newest snapshot.

    Without a snapshot (no checkpoint yet) it starts from fresh parameters.
    """
    ray = self._ray
    deadline = time.time() + timeout_s
    while True:
      left = max(1.0, deadline - time.time())
      try:
        if self.learner_snapshot is None:
          ray.get(self.learner.pid.remote(), timeout=left)
        else:
          ray.get(self.learner.set_state.remote(self.learner_snapshot["state"],
                                                self.learner_snapshot["learner_steps"]),
                  timeout=left)
        return
      except ray.exceptions.ActorDiedError as error:  # For good: Ray will not try it again.
        raise NodeCrashed(f"The learner node could not start again after a crash: "
                          f"{start_failure(error)}. See the Ray logs under "
                          "/tmp/ray/session_latest/logs.") from None
      except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError) as error:
        if time.time() > deadline:  # Still restarting after the timeout.
          raise NodeCrashed(f"The learner node did not come back within {timeout_s:.0f} s "
                            f"of a crash ({type(error).__name__}).") from None
        time.sleep(0.5)
