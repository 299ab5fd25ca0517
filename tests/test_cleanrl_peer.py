"""bench/peer_returns.py takes a CleanRL run's final return from its recorded lines
(bench/cleanrl_peer.py): the mean of the last episodes it printed. No CleanRL run here."""

from bench import cleanrl_peer

# Recorded from `cleanrl/ppo_continuous_action.py --seed=1 --env-id HalfCheetah-v4
# --total-timesteps 4096 --no-cuda` (CleanRL fe8d8a03, gymnasium 0.29.1, mujoco 2.3.3).
LINES = [
    "global_step=1000, episodic_return=[-496.37454]",
    "global_step=2000, episodic_return=[-415.2574]",
    "SPS: 166",
    "global_step=3000, episodic_return=[-429.74493]",
    "global_step=4000, episodic_return=[-336.92734]",
]


def test_the_final_return_is_the_mean_of_the_last_episodes_printed():
    final, episodes = cleanrl_peer.final_return(LINES, last=2)
    assert episodes == 4
    assert final == (-429.74493 + -336.92734) / 2


def test_a_run_that_printed_no_episode_has_no_final_return():
    assert cleanrl_peer.final_return(["SPS: 166"], last=10) == (None, 0)
