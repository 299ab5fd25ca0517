"""Evaluates the newest checkpoint of a run: greedy returns over N episodes, optionally a GIF.

Examples:
  python -m launch.evaluate --logdir=runs/latest
  python -m launch.evaluate --logdir=runs/latest --episodes=30 --epsilon=0.0
  python -m launch.evaluate --logdir=runs/latest --video=episode.gif

The agent is rebuilt from `<logdir>/config.json`, which every training run
writes. The last line printed is JSON (returns, checkpoint step, env steps).
`--video` writes one episode as a GIF from envpool's own renderer
(`render_mode="rgb_array"`, which envpool 1.2.5 supports for classic control
and Atari, among others). Only GIF: an mp4 needs a video encoder (ffmpeg),
which is not among the dependencies.
"""

import sys

import jax
import numpy as np
from absl import app, flags

from gorila_jax import envs
from gorila_jax.acting import evaluation, parts
from launch import trained as trained_lib

_LOGDIR, _EPSILON, _STEP = trained_lib.define_run_flags("evaluate")
_EPISODES = flags.DEFINE_integer("episodes", 10, "Greedy episodes to play.", lower_bound=1)
_SEED = flags.DEFINE_integer(
    "seed", None, "Env seed; unset: the run's seed + 1 (as its final eval)."
)
_VIDEO = flags.DEFINE_string("video", None, "Write one episode to this .gif file.")
_VIDEO_FPS = flags.DEFINE_integer("video_fps", 30, "Frames per second of the GIF.", lower_bound=1)


def record_gif(builder, spec, params, seed: int, path: str, fps: int) -> int:
    """Plays one episode with the evaluation policy and writes its frames to `path`.

    Returns:
      The number of frames written.
    """
    from PIL import Image  # only needed here; Pillow is pinned in requirements.txt

    try:
        env = envs.make_env(spec.env_id, 1, seed=seed, evaluation=True, render_mode="rgb_array")
        obs, _ = env.reset()
        frames = [env.render()[0]]
    except Exception as error:  # noqa: BLE001  envpool's many ways to say "cannot render"
        raise ValueError(f"envpool cannot render {spec.env_id}: {error}") from None
    try:
        policy = builder.make_policy(spec, 0, 1, evaluation=True)
        params, step, done = jax.device_put(params), 0, False
        keys = parts.step_keys(jax.random.PRNGKey(seed))  # a fresh key per step, as actors hand
        while not done:
            action = np.asarray(policy(params, obs, next(keys), step))
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(env.render()[0])  # [H, W, 3] uint8
            done, step = bool(terminated[0] or truncated[0]), step + 1
    finally:
        env.close()
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000 / fps, loop=0)
    return len(images)


def evaluate_run(
    logdir: str, episodes: int, epsilon: float | None, seed: int | None, step: int | None
) -> tuple[dict, object, object, object]:
    """Restores a run's checkpoint and plays `episodes` greedy episodes.

    Returns:
      (report, builder, spec, params): the report is what the JSON line holds.
    """
    trained = trained_lib.restore_policy(logdir, epsilon, step)
    builder, spec, params = trained.builder, trained.spec, trained.params
    seed = trained.record["experiment"]["seed"] + 1 if seed is None else seed
    returns = evaluation.evaluate(builder, spec, params, episodes, seed)
    report = {
        "logdir": logdir,
        "env_id": spec.env_id,
        "learner_step": trained.learner_step,
        "env_steps": trained.env_steps,
        "epsilon": getattr(builder.config, "eval_epsilon", None),
        "seed": seed,
        "episodes": len(returns),
        "mean_return": float(returns.mean()),
        "returns": [float(r) for r in returns],
    }
    return report, builder, spec, params


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    if _VIDEO.value and not _VIDEO.value.lower().endswith(".gif"):
        sys.exit(
            f"error: --video={_VIDEO.value}: only .gif is supported "
            "(an mp4 needs ffmpeg, which is not among the dependencies)"
        )
    trained_lib.report_or_exit(_evaluate_with_video, _summary_line)


def _evaluate_with_video() -> dict:
    report, builder, spec, params = evaluate_run(
        _LOGDIR.value, _EPISODES.value, _EPSILON.value, _SEED.value, _STEP.value
    )
    report["video"] = None
    if _VIDEO.value:
        frames = record_gif(builder, spec, params, report["seed"], _VIDEO.value, _VIDEO_FPS.value)
        report["video"] = {"path": _VIDEO.value, "frames": frames}
    return report


def _summary_line(report: dict) -> str:
    return (
        f"{report['env_id']}, learner step {report['learner_step']:,} "
        f"({report['env_steps']:,} env steps): mean greedy return {report['mean_return']:.2f} "
        f"over {report['episodes']} episodes (epsilon {report['epsilon']})"
    )


if __name__ == "__main__":
    app.run(main, flags_parser=trained_lib.parse_flags)
