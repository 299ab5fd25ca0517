"""Secure aggregation by pairwise additive masks (Bonawitz et al., 2017, without the
secret sharing): the coordinator learns the sum of the clients' updates, never one.

Each pair of clients (i, j) agrees on a secret by X25519 key agreement over public
keys that the coordinator relays (it sees only public keys, so it cannot derive the
secret). From the secret, HKDF derives a ChaCha20 key per (round, attempt), whose
keystream is the pair's mask. Client i adds the mask it shares with each j > i and
subtracts the one it shares with each j < i, so the masks cancel in the sum over all
participants. Arithmetic is on 64-bit integers modulo 2^64: float updates are
encoded in fixed point first, which makes the cancellation exact, and a masked
update is uniformly distributed over the ring whatever the update.

A client that drops out of a round (its masked update never arrives) leaves its
pairs' masks uncancelled in the others' updates. The round is then redone among
those left, with masks of a new attempt: a mask is never used twice, so the two
attempts' messages reveal nothing together that one would not. The coordinator
refuses a round with fewer than `min_clients` participants, which is what bounds
what it can learn by declaring clients dropped: never less than a sum of
`min_clients` updates.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# Fixed point: 24 fraction bits resolve 6e-8; a sum of updates may reach 2^39 (5e11)
# in magnitude before it wraps.
FRACTION_BITS = 24
_SCALE = float(1 << FRACTION_BITS)
_LARGEST = float(1 << (63 - FRACTION_BITS))
_INFO = b"gorila-jax secure aggregation mask"


class RoundRefused(Exception):
    """A round with too few participants, or masked updates from clients not in it."""


def encode(update: np.ndarray, num_clients: int) -> np.ndarray:
    """`update` (floats) in fixed point, as uint64 modulo 2^64.

    Raises:
      ValueError: a value is not finite, or so large that a sum of `num_clients`
        such values could wrap around the ring.
    """
    update = np.asarray(update, np.float64)
    if not np.all(np.isfinite(update)):
        raise ValueError("cannot aggregate an update with NaN or infinite values")
    limit = _LARGEST / max(num_clients, 1)
    if update.size and np.max(np.abs(update)) >= limit:
        raise ValueError(
            f"an update value of {np.max(np.abs(update)):.3g} is too large for a secure sum "
            f"over {num_clients} clients (fixed point with {FRACTION_BITS} fraction bits "
            f"holds values below {limit:.3g}); clip updates first"
        )
    return np.round(update * _SCALE).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray) -> np.ndarray:
    """A sum of encoded updates as float64."""
    return np.asarray(total, np.uint64).view(np.int64).astype(np.float64) / _SCALE


class MaskingClient:
    """One client's side: a key pair, and masking of its updates for a round."""

    def __init__(self, client_id: int):
        self.client_id = client_id
        self._private_key = x25519.X25519PrivateKey.generate()

    def public_key(self) -> bytes:
        return self._private_key.public_key().public_bytes_raw()

    def mask(
        self,
        update: np.ndarray,
        round_id: int,
        attempt: int,
        public_keys: Mapping[int, bytes],
    ) -> np.ndarray:
        """`update` encoded and masked for the round's participants, whose public keys
        (this client's own among them) `public_keys` holds by client id."""
        if public_keys.get(self.client_id) != self.public_key():
            raise RoundRefused(f"client {self.client_id} is not among the round's participants")
        masked = encode(np.ravel(update), len(public_keys))
        for peer, peer_key in public_keys.items():
            if peer == self.client_id:
                continue
            secret = self._private_key.exchange(x25519.X25519PublicKey.from_public_bytes(peer_key))
            pair_mask = _keystream(secret, round_id, attempt, masked.size)
            # Wrapping uint64 arithmetic is the ring's; numpy does not warn on arrays.
            masked = masked + pair_mask if self.client_id < peer else masked - pair_mask
        return masked


def _keystream(secret: bytes, round_id: int, attempt: int, size: int) -> np.ndarray:
    """`size` uint64 words of the pair's mask for (round, attempt)."""
    key = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=None,
        info=_INFO + f" round {round_id} attempt {attempt}".encode(),
    ).derive(secret)
    # A fresh key per (round, attempt), so a zero nonce never repeats under one key.
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * size)), np.uint64)


def masked_sum(
    masked_updates: Mapping[int, np.ndarray],
    participants: set[int] | frozenset[int],
    min_clients: int = 2,
) -> np.ndarray:
    """The coordinator's side: the sum (float64) of the participants' updates, from their
    masked updates, all made for the same (round, attempt) among exactly `participants`.

    Raises:
      RoundRefused: fewer than `min_clients` participants, or the masked updates are
        not exactly the participants' (a dropped client: redo the round among the
        others, with a new attempt).
    """
    if len(participants) < max(min_clients, 2):
        raise RoundRefused(
            f"a secure sum needs at least {max(min_clients, 2)} clients; "
            f"{len(participants)} took part"
        )
    missing = set(participants) - set(masked_updates)
    extra = set(masked_updates) - set(participants)
    if missing or extra:
        raise RoundRefused(
            f"masked updates missing from clients {sorted(missing)}"
            + (f" and sent by non-participants {sorted(extra)}" if extra else "")
            + ": their masks would not cancel; redo the round among the clients left"
        )
    total = np.zeros_like(next(iter(masked_updates.values())))
    for masked in masked_updates.values():
        total = total + masked
    return decode(total)
