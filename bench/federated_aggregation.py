"""What a federated round's aggregation costs: plain averaging against differentially
private, securely aggregated averaging (gorila_jax/federated), at 2, 4 and 8 clients.

For a model of the DQN CartPole preset's size (its trainable parameters) and one of
the Atari preset's, per round: each client's CPU seconds to prepare its message
(plain: none; private and masked: clip, noise, fixed-point encoding, one X25519
agreement and a ChaCha20 mask per peer), the coordinator's seconds to sum, and the
bytes each client sends (float32 plain; uint64 masked, and its 32-byte public key).
Ratios are against plain averaging in the same run. The coordinator's sum is
checked against the plain sum every round. Last line: JSON.

  python bench/federated_aggregation.py
"""

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from jax import flatten_util  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import envs  # noqa: E402
from gorila_jax.federated import privacy  # noqa: E402
from gorila_jax.federated import secure_aggregation as secagg  # noqa: E402
from agents.dqn import presets as dqn_presets  # noqa: E402

_CLIENTS = flags.DEFINE_list("clients", ["2", "4", "8"], "Client counts to measure.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds timed per setting.", lower_bound=1)


def _model_size(preset: str, env_id: str) -> int:
    config, _ = dqn_presets.dqn_preset(preset)
    builder = dqn.DQNBuilder(config)
    state = builder_lib.initial_train_state(builder, envs.env_spec(env_id), 0)
    return flatten_util.ravel_pytree(builder.state_access.trainable_params(state))[0].size


def _round(num_clients: int, size: int, rng: np.random.Generator) -> dict[str, float]:
    updates = {i: rng.normal(0, 1e-2, size).astype(np.float32) for i in range(num_clients)}
    start = time.perf_counter()
    plain = np.mean([update for update in updates.values()], axis=0)
    plain_s = time.perf_counter() - start

    settings = privacy.PrivacySettings(clip_norm=1.0, noise_multiplier=1.0)
    clients = {i: secagg.MaskingClient(i) for i in updates}
    keys = {i: client.public_key() for i, client in clients.items()}
    client_s, masked = [], {}
    for i, update in updates.items():
        start = time.perf_counter()
        noisy, _ = privacy.privatize(update, settings, num_clients, rng)
        masked[i] = clients[i].mask(noisy, 0, 0, keys)
        client_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    total = secagg.masked_sum(masked, set(updates))
    coordinator_s = time.perf_counter() - start
    assert np.isfinite(total).all() and np.abs(total / num_clients - plain).max() < 10
    return {
        "plain_coordinator_s": plain_s,
        "client_s": float(np.mean(client_s)),
        "coordinator_s": coordinator_s,
        "plain_bytes_per_client": 4 * size,
        "bytes_per_client": masked[0].nbytes + len(keys[0]),  # its update and its public key
    }


def main(argv):
    del argv
    rng = np.random.default_rng(0)
    rows = []
    for model, preset, env_id in (
        ("cartpole", "cartpole", "CartPole-v1"),
        ("atari", "simple", "Pong-v5"),
    ):
        size = _model_size(preset, env_id)
        for num_clients in map(int, _CLIENTS.value):
            rounds = [_round(num_clients, size, rng) for _ in range(_ROUNDS.value)]
            row = {key: float(np.median([r[key] for r in rounds])) for key in rounds[0]}
            row.update(model=model, parameters=size, clients=num_clients)
            row["bytes_ratio"] = row["bytes_per_client"] / row["plain_bytes_per_client"]
            rows.append(row)
            print(
                f"{model:8s} {size:>9,} params, {num_clients} clients: client "
                f"{row['client_s'] * 1e3:8.1f} ms, coordinator {row['coordinator_s'] * 1e3:7.1f} "
                f"ms (plain {row['plain_coordinator_s'] * 1e3:6.1f} ms), bytes "
                f"{row['bytes_ratio']:.2f}x plain",
                flush=True,
            )
    print(json.dumps({"bench": "federated_aggregation", "rows": rows}))


if __name__ == "__main__":
    app.run(main)
