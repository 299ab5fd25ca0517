"""Env specs a learner can use where envpool is not installed (`bench/gpu_check.sh
--offline`'s learner stage, which runs with envpool made unimportable)."""

from gorila_jax import envs, types

# What `envs.env_spec` gives with envpool 1.2.7 (tests/test_gpu_check.py holds them to it):
# the learner stage of `bench/gpu_check.sh --offline` runs where envpool is not installed.
RECORDED_SPECS = {
    "Pong-v5": types.EnvSpec("Pong-v5", (4, 84, 84), "uint8", (), "int32", 6, (), (), 27000),
    "CartPole-v1": types.EnvSpec("CartPole-v1", (4,), "float32", (), "int32", 2, (), (), 500),
}


def learner_spec(env_id: str) -> types.EnvSpec:
    """`env_id`'s spec from envpool, or without envpool the one recorded here."""
    try:
        return envs.env_spec(env_id)
    except ModuleNotFoundError as error:
        if error.name != "envpool" or env_id not in RECORDED_SPECS:
            raise ValueError(
                f"--env={env_id}: describing it needs envpool ({error}); without envpool "
                f"the learner runs on the shapes of {', '.join(sorted(RECORDED_SPECS))}"
            ) from None
        return RECORDED_SPECS[env_id]
