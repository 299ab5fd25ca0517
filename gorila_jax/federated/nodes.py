"""The nodes of a federated run: a learner per client, and the coordinator that averages
their updates round by round (federated averaging, McMahan et al., 2017).

A round: every client starts from the round's global parameters, learns
`local_updates` updates from its own replay (its own actors, its own env
seeds), and waits. The coordinator then asks each for its update (its
parameters minus the round's global ones), which the client clips and noises
(`privacy`, if configured) and masks (`secure_aggregation`, if on) before it
leaves the client; the coordinator sums them, adds the mean to the global
parameters and sends the result to every client, which starts the next round.

A client that fails to answer (dead, being restarted) is left out of the
round: the round is redone among the others with masks of a new attempt, and
the replacement gets the current global parameters when it is back. Fewer than
two clients able to answer: the coordinator waits for them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import flatten_util

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, types
from gorila_jax.distributed import program
from gorila_jax.federated import privacy as privacy_lib
from gorila_jax.federated import secure_aggregation as secagg
from gorila_jax.health.monitor import HEARTBEAT_INTERVAL_S
from gorila_jax.learning import checkpoint, learner

GROUP = "coordinator"
ROUNDS_METRIC = "federated/rounds"
EPSILON_METRIC = "federated/epsilon"


class CoordinatorSettings(NamedTuple):
    """How the coordinator runs rounds, reports and checkpoints.

    Attributes:
      local_updates: the clients' learner steps per round.
      rounds: rounds to run; 0 runs until stopped.
      privacy: the clients' privacy settings, for the epsilon reported each round.
      secure: the clients mask their updates.
      heartbeat_interval_s: heartbeat period.
      checkpoint_every_rounds: a checkpoint of the global model after every this many
        rounds, and when the coordinator stops; 0: none.
      max_checkpoints_to_keep: older checkpoints are deleted.
    """

    local_updates: int
    rounds: int = 0
    privacy: privacy_lib.PrivacySettings | None = None
    secure: bool = True
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    checkpoint_every_rounds: int = 0
    max_checkpoints_to_keep: int = 2


class FederatedClientNode(learner.LearnerNode):
    """A client's learner: `LearnerNode` on the client's replay, paused at the end of each
    round until the coordinator sends the next round's global parameters.

    Args (besides `LearnerNode`'s):
      client_index: this client's index; the node is "learner/<client_index>".
      local_updates: learner steps per round.
      privacy: clip and noise settings; None sends the update as it is.
      secure: mask updates so that the coordinator learns only their sum.
    """

    def __init__(
        self,
        *args: Any,
        client_index: int,
        local_updates: int,
        privacy: privacy_lib.PrivacySettings | None,
        secure: bool,
        **kwargs: Any,
    ):
        super().__init__(*args, name=f"learner/{client_index}", **kwargs)
        self._client_index, self._local_updates = client_index, local_updates
        self._privacy, self._masker = privacy, secagg.MaskingClient(client_index)
        self._secure = secure
        self._round_start: np.ndarray | None = None  # the round's global parameters, flat
        self._round_start_step = self._steps
        self._training = threading.Event()  # set while the round has local updates to go
        _, self._unravel = flatten_util.ravel_pytree(self._trainable())

    def _trainable(self) -> Any:
        return jax.device_get(
            self._builder.state_access.trainable_params(parallel.unreplicate(self._state))
        )

    def step(self, timeout: float = 1.0) -> bool:
        if self._steps - self._round_start_step >= self._local_updates:
            self._training.clear()  # the round's updates are done: wait for the next round
        if not self._training.wait(min(timeout, 0.1)):
            return False
        return super().step(timeout)

    def public_key(self) -> bytes:
        return self._masker.public_key()

    def updates_in_round(self) -> int:
        """Learner steps since the round began; -1 before the first global parameters."""
        return -1 if self._round_start is None else self._steps - self._round_start_step

    def set_global(self, global_params: np.ndarray) -> None:
        """Starts a round from `global_params` (flat): they replace the trainable ones."""
        with self._state_lock:
            state = parallel.unreplicate(self._state)
            params = self._unravel(np.asarray(global_params, np.float32))
            state = self._builder.state_access.with_trainable_params(state, params)
            self._state = parallel.replicate(state, self._devices)
            with self._params_lock:
                self._published = parallel.unreplicate(
                    self._builder.state_access.actor_params(self._state)
                )
            self._round_start = np.asarray(global_params, np.float64)
            self._round_start_step = self._steps
        self._training.set()

    def round_update(
        self, round_id: int, attempt: int, public_keys: dict[int, bytes]
    ) -> tuple[np.ndarray, float]:
        """(this round's update as sent: clipped, noised and masked as configured, the
        update's norm before clipping), for the round's participants' `public_keys`."""
        if self._round_start is None:
            raise RuntimeError(f"{self._name} has no global parameters to take an update from")
        with self._state_lock:
            current, _ = flatten_util.ravel_pytree(self._trainable())
        update = np.asarray(current, np.float64) - self._round_start
        norm = float(np.linalg.norm(update))
        if self._privacy is not None:
            # Masked, only the sum is seen: each client adds its share of the sum's noise.
            # In the clear, each update is seen alone and carries all of it.
            share_among = len(public_keys) if self._secure else 1
            update, norm = privacy_lib.privatize(update, self._privacy, share_among)
        if self._secure:
            update = self._masker.mask(update, round_id, attempt, public_keys)
        return update, norm


class CoordinatorNode(program.Worker):
    """Averages the clients' updates into the global parameters, one round at a time, and
    serves those parameters to the evaluator (`get_params`, as a learner does).

    Its checkpoints are the run's (`<logdir>/checkpoints/learner/<round>`): the agent's
    initial state with the global trainable parameters, saved with the monitor's state as
    a learner's are, so that `--resume` finds them where it finds a learner's. Each
    client keeps its own learner and replay checkpoints (`checkpoint.client_logdir`).

    Args:
      builder, spec, seed: the agent, the env, and the seed of the initial parameters.
      clients: the clients' learners (`FederatedClientNode`), in client order.
      monitor: the monitor's client (or None).
      settings: rounds, privacy, reports and checkpoints (`CoordinatorSettings`).
      checkpoint_dir: where its checkpoints go (absolute); None: none.
      restore_step: the round of the checkpoint to start from (a resume); None: round 0.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        clients: list[program.Client],
        monitor: program.Client | None,
        seed: int,
        settings: CoordinatorSettings,
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
    ):
        super().__init__()
        self._builder, self._clients, self._monitor = builder, clients, monitor
        self._settings = settings
        self._template = jax.device_get(builder_lib.initial_train_state(builder, spec, seed))
        flat, self._unravel = flatten_util.ravel_pytree(
            builder.state_access.trainable_params(self._template)
        )
        self._global = np.asarray(flat, np.float64)
        self._round = 0
        self._bytes_received = 0
        self._redone = 0
        self._checkpoints = None
        if checkpoint_dir is not None:
            self._checkpoints = checkpoint.LearnerCheckpoints(
                checkpoint_dir, settings.max_checkpoints_to_keep
            )
        if restore_step is not None:
            self._restore(restore_step)
        self._last_checkpoint_round = self._round
        self._lock = threading.Lock()
        self._version, self._published = self._round, self._actor_params()
        self._epsilon = self._epsilon_after(self._round)

    def _restore(self, round_saved: int) -> None:
        if self._checkpoints is None:
            raise ValueError("restore_step needs a checkpoint_dir")
        state, meta = self._checkpoints.restore(round_saved, self._template)
        flat, _ = flatten_util.ravel_pytree(self._builder.state_access.trainable_params(state))
        self._global = np.asarray(flat, np.float64)
        self._round = round_saved
        counters = meta.get("node_counters", {}).get(self.name, {})
        self._redone = int(counters.get("redone_attempts", 0))
        self._bytes_received = int(meta.get("federated", {}).get("bytes_received", 0))

    def _epsilon_after(self, rounds: int) -> float:
        if self._settings.privacy is None or not rounds:
            return 0.0
        return privacy_lib.epsilon_after(self._settings.privacy, rounds)

    def save_checkpoint(self) -> int:
        """Saves the global model at the current round, with the monitor's state (every
        node's counters, the returns and evaluations) as a learner's checkpoint has it.

        Returns:
          The round saved.
        """
        if self._checkpoints is None:
            raise RuntimeError(f"{self.name} was built without a checkpoint_dir")
        with self._lock:
            round_now, flat = self._round, self._global
        meta = checkpoint.run_meta(
            self._monitor,
            self.name,
            self._counters(),
            round_now,
            federated={"bytes_received": self._bytes_received},
        )
        self._checkpoints.save(round_now, jax.device_get(self._state_of(flat)), meta)
        self._last_checkpoint_round = round_now
        return round_now

    @property
    def name(self) -> str:
        return f"{GROUP}/0"

    def _state_of(self, flat_params: np.ndarray) -> Any:
        """The agent's initial state with `flat_params` as its trainable parameters."""
        params = self._unravel(np.asarray(flat_params, np.float32))
        return self._builder.state_access.with_trainable_params(self._template, params)

    def _actor_params(self) -> Any:
        return self._builder.state_access.actor_params(self._state_of(self._global))

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """(version, the global model's actor parameters); None if not newer than `newer_than`.
        The version counts rounds."""
        with self._lock:
            return None if self._version <= newer_than else (self._version, self._published)

    def run(self) -> None:
        try:
            self._sync_all()
            rounds = self._settings.rounds
            while not self.stopping and (not rounds or self._round < rounds):
                participants = self._wait_for_round()
                if participants is None:
                    break
                self._run_round(participants)
                every = self._settings.checkpoint_every_rounds
                if every and self._round - self._last_checkpoint_round >= every:
                    self.save_checkpoint()
            self._report(block=True)  # the final checkpoint reads the monitor's counters
            if self._checkpoints is not None:
                self.save_checkpoint()
        finally:
            self._finished.set()

    def _sync_all(self) -> None:
        for index in range(len(self._clients)):
            self._send_global(index)

    def _send_global(self, index: int) -> bool:
        try:
            self._clients[index].set_global(np.asarray(self._global, np.float32))
            return True
        except Exception as error:  # noqa: BLE001  a client being restarted; retried
            logging.warning("coordinator: client %d did not take the parameters: %r", index, error)
            return False

    def _wait_for_round(self) -> list[int] | None:
        """The clients that finished this round's local updates, once every client that
        answers did (a client without parameters, a replacement, gets the current ones);
        None if stopped."""
        last_report = 0.0
        while not self.stopping:
            done, waiting = [], 0
            for index, client in enumerate(self._clients):
                try:
                    steps = client.updates_in_round()
                except Exception:  # noqa: BLE001  dead or restarting: not in this round
                    continue
                if steps < 0:
                    self._send_global(index)
                if steps >= self._settings.local_updates:
                    done.append(index)
                else:
                    waiting += 1
            if len(done) >= 2 and not waiting:
                return done
            if time.monotonic() - last_report >= self._settings.heartbeat_interval_s:
                self._report()
                last_report = time.monotonic()
            self.sleep(0.05)
        return None

    def _run_round(self, participants: list[int]) -> None:
        attempt = 0
        while len(participants) >= 2 and not self.stopping:
            keys = {}
            for index in list(participants):
                try:
                    keys[index] = self._clients[index].public_key()
                except Exception:  # noqa: BLE001
                    participants.remove(index)
            futures = {
                i: self._clients[i].futures.round_update(self._round, attempt, keys) for i in keys
            }
            answers, dropped = {}, []
            for index, future in futures.items():
                try:
                    answers[index] = future.result()
                except Exception as error:  # noqa: BLE001  redone without it
                    logging.warning("coordinator: client %d dropped out: %r", index, error)
                    dropped.append(index)
            if dropped:
                participants = [i for i in keys if i not in dropped]
                attempt += 1
                self._redone += 1
                continue
            self._bytes_received += sum(update.nbytes for update, _ in answers.values())
            updates = {i: update for i, (update, _) in answers.items()}
            if self._settings.secure:
                total = secagg.masked_sum(updates, set(updates))
            else:
                total = np.sum([np.asarray(u, np.float64) for u in updates.values()], axis=0)
            with self._lock:
                self._global = self._global + total / len(updates)
                self._round += 1
                self._version = self._round
                self._published = self._actor_params()
            self._epsilon = self._epsilon_after(self._round)
            for index in range(len(self._clients)):
                self._send_global(index)
            self._report()
            return

    def _counters(self) -> dict[str, int]:
        return {"rounds": self._round, "redone_attempts": self._redone}

    def _report(self, block: bool = False) -> None:
        if self._monitor is None:
            return
        metrics = {
            ROUNDS_METRIC: float(self._round),
            "federated/bytes_received": float(self._bytes_received),
        }
        if self._settings.privacy is not None:
            metrics[EPSILON_METRIC] = self._epsilon
        report = self._monitor.report if block else self._monitor.futures.report
        report(self.name, self._counters(), metrics=metrics)
