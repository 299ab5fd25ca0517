"""Episode returns of a policy on a gymnax env, played by gymnax's own step and auto-reset:
how the peer scripts evaluate a peer's final parameters (bench/purejaxrl_ppo.py,
bench/gymnax_blines_ppo.py). Runs in a peer's venv: it needs only JAX and gymnax."""


def episode_returns(env, env_params, act, key, episodes: int):
    """The return of each of `episodes` first episodes, played side by side.

    Args:
      act: (observations [episodes, ...], key) -> actions [episodes].
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    keys = jax.random.split(key, episodes)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)

    def step(carry, _):
        obs, state, key, returns, running = carry
        key, step_key = jax.random.split(key)
        # The policy's key is folded from the step's, so a greedy policy leaves the
        # env's keys as they were before the policy took one.
        actions = act(obs, jax.random.fold_in(step_key, 1))
        out = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, episodes), state, actions, env_params
        )
        # gymnax 0.0.x returns (obs, state, reward, done, info); 1.x splits done into
        # terminated and truncated.
        obs, state, reward = out[:3]
        done = out[3] if len(out) == 5 else out[3] | out[4]
        returns = returns + reward * running
        return (obs, state, key, returns, running & ~done), None

    carry = (obs, state, key, jnp.zeros(episodes), jnp.ones(episodes, bool))
    carry, _ = jax.lax.scan(step, carry, None, env_params.max_steps_in_episode)
    return carry[3]
