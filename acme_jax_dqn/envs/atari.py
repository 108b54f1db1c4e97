"""Atari 2600 games through ale-py, preprocessed by gymnasium's wrappers (Machado et al. 2018 settings).

`atari:Pong` is `ALE/Pong-v5` made with frameskip 1, sticky actions 0.25,
the minimal action set and episodes capped at 108,000 frames, then
`AtariPreprocessing` (up to 30 no-op starts, frame skip 4 with a max over
the last two frames, 84x84 grayscale uint8, no terminal on life loss) and
`FrameStackObservation` (4 frames), moved to channels-last [84, 84, 4] for
the Nature conv torso. ale-py's wheels ship the ROMs.
"""

import gymnasium as gym
import numpy as np

FRAME_SKIP = 4
SCREEN_SIZE = 84
STACK = 4
NOOP_MAX = 30
STICKY_ACTIONS = 0.25
MAX_FRAMES = 108_000


def _register_ale() -> None:
  try:
    import ale_py  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("atari: environments need ale-py (and opencv for the preprocessing): "
                     "pip install ale-py opencv-python-headless (or, in the kit's checkout, "
                     "pip install -e '.[atari]').") from None
  gym.register_envs(ale_py)


def games() -> list:
  _register_ale()
  return sorted(k[len("ALE/"):-len("-v5")] for k in gym.registry
                if k.startswith("ALE/") and k.endswith("-v5"))


def game_id(game: str) -> str:
  """'Pong' (or 'Pong-v5') -> 'ALE/Pong-v5', with a clear error for unknown games."""
  _register_ale()
  name = game[:-len("-v5")] if game.endswith("-v5") else game
  env_id = f"ALE/{name}-v5"
  if env_id not in gym.registry:
    close = [g for g in games() if name.lower()[:4] in g.lower()][:5]
    hint = f" Did you mean {', '.join('atari:' + g for g in close)}?" if close else ""
    raise ValueError(f"ale-py has no Atari game {name!r}.{hint} Games are named as "
                     "atari:Pong, atari:Breakout, atari:SpaceInvaders, ...")
  return env_id


def make_atari(game: str) -> gym.Env:
  """The preprocessed gymnasium environment for `game` (observations uint8 [84, 84, 4])."""
  env = gym.make(game_id(game), frameskip=1, repeat_action_probability=STICKY_ACTIONS,
                 full_action_space=False, max_num_frames_per_episode=MAX_FRAMES,
                 disable_env_checker=True)
  env = gym.wrappers.AtariPreprocessing(
      env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
      terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
  env = gym.wrappers.FrameStackObservation(env, STACK)
  space = gym.spaces.Box(0, 255, (SCREEN_SIZE, SCREEN_SIZE, STACK), np.uint8)
  return gym.wrappers.TransformObservation(
      env, lambda frames: np.ascontiguousarray(np.moveaxis(frames, 0, -1)), space)
