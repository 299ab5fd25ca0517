"""The Anakin loop (Hessel et al. 2021, "Podracer architectures"): acting, the env step and
the agent's update compiled into one program per device, run under `jax.pmap`.

One iteration, per device: the agent's acting policies step this device's envs T times
(`lax.scan`; a gymnax env's pure step, `gymnax_envs.vector_programs`), the steps become a
`types.Trajectory` [envs, T] as an actor's adder would see them, and the agent learns
from it (`Learning`) through the learner's guarded update (`step.make_step`): an
on-policy agent's batch is the rollout itself (`on_policy`), an off-policy agent's
transitions go into a replay on the device and it samples its updates from there
(`off_policy`). A device call runs `iterations` of them (`lax.scan`), the last ones
skipped where the budget ends first; it reports the metrics of the last one that updated,
and an on-policy call does not compute the others'.

The envs are laid out as the distributed run's actors hold them: `num_actors` actors of
`num_envs_per_actor` envs, `num_actors / D` actors to each of the D devices; each actor's
envs act with that actor's policy (`make_policy(actor_index)`: DQN's per-actor epsilon),
and its steps carry its index, so an agent sees the same data either way.
"""

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import gymnax_envs, parallel, replay, types
from gorila_jax.anakin import device_replay

# Folded into the run's seed for the envs' and policies' keys (the learner's state uses 0,
# its rollback noise 2**20).
_KEY_SALT = 3


class Layout(NamedTuple):
    """How the envs are spread: `actors_per_device` actors of `envs_per_actor` envs on each
    of `num_devices` devices, `trajectory_length` steps per iteration."""

    num_devices: int
    actors_per_device: int
    envs_per_actor: int
    trajectory_length: int

    @property
    def envs_per_device(self) -> int:
        return self.actors_per_device * self.envs_per_actor

    @property
    def env_steps_per_iteration(self) -> int:
        """Every env's steps of one iteration, the resets' included."""
        return self.num_devices * self.envs_per_device * self.trajectory_length


class EnvCarry(NamedTuple):
    """One device's envs between steps.

    Attributes:
      key: the device's key; the env steps and policies split theirs from it.
      state: the gymnax states of its envs.
      ended: [envs] bool, the last step ended the episode (the next one resets).
      observation: [envs, ...] what the policies act on next.
      returns: [envs] float32, the running episodes' returns so far.
      actor_steps: [actors_per_device] int32, each actor's valid env steps (what an
        actor hands its policy for schedules).
    """

    key: jax.Array
    state: Any
    ended: jax.Array
    observation: jax.Array
    returns: jax.Array
    actor_steps: jax.Array


class CallOutput(NamedTuple):
    """What a device call gives back beside the new state, guard and envs.

    Attributes:
      info: the last update's `StepInfo` (metrics per device).
      published: the actor parameters after the last update (the same on every device).
      finished_returns: [iterations, T, envs] the return of each episode that ended at
        that step, NaN elsewhere (and in skipped iterations).
      env_steps: [iterations] valid env steps (a reset's step is none), 0 when skipped.
      updates: [iterations] the updates each made (learner steps).
    """

    info: builder_lib.StepInfo
    published: Any
    finished_returns: jax.Array
    env_steps: jax.Array
    updates: jax.Array


def _device_policies(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, layout: Layout, num_actors: int
) -> Callable:
    """(actor params, observation [envs], key, actor_steps) -> (action, extras) for this
    device's envs, each actor's slice by that actor's policy."""
    policies = [
        builder.make_policy(spec, index, num_actors, evaluation=False)
        for index in range(num_actors)
    ]
    per_actor, envs = layout.actors_per_device, layout.envs_per_actor

    def on_device(device: int) -> Callable:
        def act(params, observation, key, actor_steps):
            keys = jax.random.split(key, per_actor)
            outputs = [
                builder_lib.split_policy_output(
                    policies[device * per_actor + j](
                        params, observation[j * envs : (j + 1) * envs], keys[j], actor_steps[j]
                    )
                )
                for j in range(per_actor)
            ]
            actions = jnp.concatenate([action for action, _ in outputs])
            extras = jax.tree.map(lambda *parts: jnp.concatenate(parts), *[e for _, e in outputs])
            return actions, extras

        return act

    if layout.num_devices == 1:
        return on_device(0)
    branches = [on_device(device) for device in range(layout.num_devices)]
    # Each device runs its own actors' policies: every branch compiles, one runs.
    return lambda *args: jax.lax.switch(parallel.device_index(), branches, *args)


def make_reset(env_id: str, layout: Layout) -> Callable:
    """(key) -> EnvCarry of one device's fresh envs; for `parallel.pmap_step`."""
    reset, _ = gymnax_envs.vector_programs(env_id, layout.envs_per_device)

    def fresh(key):
        key, observation, state, ended = reset(key)
        return EnvCarry(
            key,
            state,
            ended,
            observation,
            jnp.zeros(layout.envs_per_device, jnp.float32),
            jnp.zeros(layout.actors_per_device, jnp.int32),
        )

    return fresh


def env_keys(seed: int, env_steps: int, num_devices: int) -> np.ndarray:
    """[D] keys of the devices' envs; a resumed run (`env_steps` on) draws new ones."""
    root = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _KEY_SALT), env_steps)
    return np.stack([np.asarray(jax.random.fold_in(root, d)) for d in range(num_devices)])


class Learning(NamedTuple):
    """How one iteration learns from its rollout, and what it keeps between iterations.

    learn(state, guard, kept, trajectory) -> (state, guard, kept, metrics, updates):
    an on-policy agent's one update on the rollout itself (`kept` is ()); an off-policy
    agent's transitions into its device replay and the updates its replay ratio owes
    (`off_policy`).
    """

    learn: Callable
    initial: Callable[[jax.Array], Any]  # a device's key -> its `kept` at the start
    # Every iteration updates (on-policy): the call reports its last active iteration's
    # metrics, and the iterations before it skip computing theirs (`make_call`).
    updates_every_iteration: bool = False


def on_policy(update: Callable, layout: Layout) -> Learning:
    """The rollout is the batch, one chunk per env: one update per iteration."""
    envs = layout.envs_per_device

    def learn(state, guard, kept, trajectory):
        batch = builder_lib.SampledBatch(
            trajectory,
            probabilities=jnp.ones(envs, jnp.float32),
            table_size=jnp.full(envs, envs * layout.num_devices, jnp.int32),
        )
        state, guard, info, _ = update(state, guard, batch)
        return state, guard, kept, info.metrics, jnp.ones((), jnp.int32)

    return Learning(learn, lambda key: (), updates_every_iteration=True)


class OffPolicyKept(NamedTuple):
    """What an off-policy iteration keeps: the device's replay, each env's last n - 1 steps
    (the start of transitions the next rollout completes), the updates owed, a key."""

    ring: device_replay.Ring
    tail: types.Trajectory
    owed: jax.Array
    key: jax.Array


def off_policy(
    update: Callable,
    layout: Layout,
    spec: types.EnvSpec,
    nstep: replay.NStep,
    table: replay.TableSpec,
    batch_size: int,
) -> Learning:
    """The rollout's n-step transitions go into the device replay; once it holds the
    table's minimum, each inserted item owes samples_per_insert / batch_size updates
    (the rate limiter's ratio), each on a batch sampled from it, whose new priorities
    go back into it."""
    devices, envs, length = layout.num_devices, layout.envs_per_device, layout.trajectory_length
    held = nstep.n - 1
    rows = batch_size // devices
    per_item = table.rate_limit.samples_per_insert / batch_size
    most = math.ceil(per_item * devices * envs * length) + 1  # updates one iteration may owe
    capacity = -(-table.max_size // devices)
    observation = jnp.zeros(spec.observation_shape, spec.observation_dtype)
    example = types.Transition(
        observation,
        jnp.zeros(spec.action_shape, spec.action_dtype),
        jnp.float32(0),
        jnp.float32(0),
        observation,
    )

    def initial(key):
        def steps(shape=(), dtype=jnp.float32):
            return jnp.zeros((envs, held, *shape), dtype)

        tail = types.Trajectory(
            observation=steps(spec.observation_shape, spec.observation_dtype),
            action=steps(spec.action_shape, spec.action_dtype),
            reward=steps(),
            terminated=steps(dtype=bool),
            truncated=steps(dtype=bool),
            valid=steps(dtype=bool),  # nothing before the first step
            extras=None,
            param_version=None,
            actor_index=None,
        )
        ring = device_replay.empty(example, capacity)
        return OffPolicyKept(ring, tail, jnp.zeros((), jnp.float32), key)

    def learn(state, guard, kept: OffPolicyKept, trajectory: types.Trajectory):
        steps = trajectory._replace(
            observation=trajectory.observation[:, :-1],
            extras=None,
            param_version=None,
            actor_index=None,
        )
        window = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), kept.tail, steps)
        tail = jax.tree.map(lambda x: x[:, length : length + held], window)
        window = window._replace(
            observation=jnp.concatenate(
                [window.observation, trajectory.observation[:, -1:]], axis=1
            )
        )
        items, real = jax.vmap(device_replay.n_step_transitions, in_axes=(0, None))(window, nstep)
        flat = lambda x: x.reshape((-1, *x.shape[2:]))  # noqa: E731  [envs, T] -> [envs * T]
        exponent = table.priority_exponent
        ring = device_replay.insert(
            kept.ring, jax.tree.map(flat, items), flat(real), nstep.initial_priority, exponent
        )
        size = parallel.psum(ring.size)
        filled = size >= table.rate_limit.min_size
        owed = kept.owed + jnp.where(filled, parallel.psum(real.sum()) * per_item, 0.0)
        updates = jnp.minimum(jnp.floor(owed), most).astype(jnp.int32)

        def one(carry):
            state, guard, ring, key = carry
            key, sample_key = jax.random.split(key)
            indices, data, probabilities = device_replay.sample(ring, sample_key, rows, exponent)
            batch = builder_lib.SampledBatch(data, probabilities, jnp.full(rows, size))
            state, guard, info, _ = update(state, guard, batch)
            if info.priorities is not None:
                ring = device_replay.set_priorities(ring, indices, info.priorities, exponent)
            return (state, guard, ring, key), info.metrics

        def skipped(carry):
            shapes = jax.eval_shape(one, carry)[1]
            return carry, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        (state, guard, ring, key), metrics = jax.lax.scan(
            lambda carry, index: jax.lax.cond(index < updates, one, skipped, carry),
            (state, guard, ring, kept.key),
            jnp.arange(most),
        )
        metrics = jax.tree.map(lambda m: m[jnp.maximum(updates - 1, 0)], metrics)
        kept = OffPolicyKept(ring, tail, owed - updates, key)
        return state, guard, kept, metrics, updates

    return Learning(learn, initial)


def make_call(
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    layout: Layout,
    num_actors: int,
    iterations: int,
    learning: Learning,
) -> Callable:
    """The per-device call ((state, guard, envs, kept), first version, active iterations)
    -> ((state, guard, envs, kept), CallOutput); for `parallel.pmap_step`, the version
    and the count given whole to every device."""
    _, env_step = gymnax_envs.vector_programs(spec.env_id, layout.envs_per_device)
    act = _device_policies(builder, spec, layout, num_actors)
    access = builder.state_access
    length, per_actor = layout.trajectory_length, layout.actors_per_device
    envs_per_device = layout.envs_per_device
    observation_dtype, action_dtype = spec.observation_dtype, spec.action_dtype

    def one_step(params, envs: EnvCarry):
        key, policy_key = jax.random.split(envs.key)
        action, extras = act(params, envs.observation, policy_key, envs.actor_steps)
        action = action.astype(action_dtype)
        key, observation, state, reward, terminated, truncated = env_step(
            key, envs.state, envs.ended, action
        )
        valid = ~envs.ended  # a step that only reset the env: its action was ignored
        ended = terminated | truncated
        returns = envs.returns + jnp.where(valid, reward, 0.0)
        actor_steps = envs.actor_steps + valid.reshape(per_actor, -1).sum(1).astype(jnp.int32)
        record = (envs.observation, action, reward, terminated, truncated, valid, extras)
        carry = EnvCarry(
            key,
            state,
            ended,
            observation.astype(observation_dtype),
            jnp.where(ended, 0.0, returns),
            actor_steps,
        )
        return carry, (record, jnp.where(ended, returns, jnp.nan))

    def rollout(params, envs: EnvCarry, version):
        envs, ((obs, action, reward, term, trunc, valid, extras), finished) = jax.lax.scan(
            lambda carry, _: one_step(params, carry), envs, None, length
        )
        by_env = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  [T, envs] -> [envs, T]
        first_actor = parallel.device_index() * per_actor
        trajectory = types.Trajectory(
            observation=by_env(jnp.concatenate([obs, envs.observation[None]])),
            action=by_env(action),
            reward=by_env(reward.astype(jnp.float32)),
            terminated=by_env(term),
            truncated=by_env(trunc),
            valid=by_env(valid),
            extras=jax.tree.map(by_env, extras),
            param_version=jnp.full((envs_per_device, length), version, jnp.int32),
            actor_index=(first_actor + jnp.arange(envs_per_device) // layout.envs_per_actor).astype(
                jnp.int32
            ),
        )
        return envs, trajectory, finished, valid.sum()

    def iterate(carry, version):
        state, guard, envs, kept = carry
        envs, trajectory, finished, env_steps = rollout(access.actor_params(state), envs, version)
        state, guard, kept, metrics, updates = learning.learn(state, guard, kept, trajectory)
        return (state, guard, envs, kept), (metrics, finished, env_steps, updates)

    def call(carry, first_version, active):
        def skipped(carry, _version):
            shapes = jax.eval_shape(lambda c: iterate(c, first_version)[1], carry)
            return carry, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def unreported(carry, version):
            # Only the last iteration's metrics leave the call: with these zeros instead,
            # XLA leaves out what only the metrics need (PPO's per-actor KL pass: 4 % of
            # an iteration on Breakout-MinAtar, docs/benchmarks.md).
            carry, (metrics, *rest) = iterate(carry, version)
            return carry, (jax.tree.map(jnp.zeros_like, metrics), *rest)

        def body(carry, index):
            version = first_version + index
            if not learning.updates_every_iteration:
                # Which iteration updates last is known only as they run: all report.
                return jax.lax.cond(index < active, iterate, skipped, carry, version)
            branch = jnp.where(index < active - 1, 0, jnp.where(index < active, 1, 2))
            return jax.lax.switch(branch, [unreported, iterate, skipped], carry, version)

        carry, (metrics, finished, env_steps, updates) = jax.lax.scan(
            body, carry, jnp.arange(iterations, dtype=jnp.int32)
        )
        finished = jnp.where(jnp.arange(iterations)[:, None, None] < active, finished, jnp.nan)
        # The metrics of the last iteration that updated (zeros where none did).
        last = jnp.max(jnp.where(updates > 0, jnp.arange(iterations), 0))
        metrics = jax.tree.map(lambda m: m[last], metrics)
        published = access.actor_params(carry[0])
        info = builder_lib.StepInfo(None, metrics)
        return carry, CallOutput(info, published, finished, env_steps, updates)

    return call


# `parallel.pmap_step` axes of `make_call`'s call: the carry per device, the version and
# the count whole; out: the carry and CallOutput per device, the published parameters once.
IN_AXES = (0, None, None)
OUT_AXES = (0, CallOutput(0, None, 0, 0, 0))
