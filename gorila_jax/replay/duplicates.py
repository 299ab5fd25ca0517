"""Duplicate-aware priorities (the design brief, 2.2): priority = |delta| + eps * sqrt(N).

N is the number of actors that produced the same transition, told apart by a
hash of its content (`ItemCodec.content_hashes`). Reverb sees no content and
counts nothing across writers, so the learner counts: each row it samples
adds the row's source actor to the set of actors known for the row's hash.
An item's N is therefore the number of actors whose copy of it the learner
has sampled so far. Each item is sampled `samples_per_insert` times on
average (DQN's CartPole preset: 8 and up), so the count reaches the true one
with the first samples of the later copies; until then the bonus is the
smaller one. The counts live in the learner: a restarted learner counts
again from its first batch.

Where it matters: deterministic environments (CartPole and every MuJoCo task
from a fixed start, Atari without sticky actions) with actors that start
from the same seeds or act greedily, so that several actors write the very
same transitions. With stochastic envs or distinct seeds N is 1 almost
everywhere and the bonus is a constant eps, as PER's own epsilon.
"""

import collections

import numpy as np


class DuplicateCounter:
    """Counts, per content hash, the distinct actors whose copy the learner sampled.

    Memory is bounded: the `capacity` hashes seen longest ago are forgotten
    first (an item that left the replay is sampled no more; the replay's
    size is the natural capacity).

    Args:
      bonus: eps in |delta| + eps * sqrt(N); > 0.
      capacity: hashes remembered at most.
    """

    def __init__(self, bonus: float, capacity: int):
        if not bonus > 0:
            raise ValueError(f"the duplicate priority bonus must be > 0, got {bonus}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._bonus, self._capacity = float(bonus), int(capacity)
        # hash -> bitmask of the actors seen with it (indices >= 63 share the top bit).
        self._actors: collections.OrderedDict[int, int] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._actors)

    def count(self, hashes: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """Adds one sampled batch; [B] N of each row (its content's actors, its own included).

        Args:
          hashes: [B] uint64 content hashes of the rows.
          sources: [B] int32 the actor that wrote each row (`replay.UNKNOWN_SOURCE`
            counts as an actor of its own).
        """
        masks = []
        for content, source in zip(
            np.asarray(hashes).reshape(-1).tolist(), np.asarray(sources).reshape(-1).tolist()
        ):
            # UNKNOWN_SOURCE (-1) and demonstrations (-2) are bit 0
            bit = 1 << min(max(source + 1, 0), 63)
            mask = self._actors.pop(content, 0) | bit
            self._actors[content] = mask  # newest last: the oldest go first
            masks.append(mask)
        while len(self._actors) > self._capacity:
            self._actors.popitem(last=False)
        # A row's twin later in the same batch counts for the rows after it only: the
        # next sample of the row catches up.
        return np.array([mask.bit_count() for mask in masks], np.int64)

    def bonus(self, hashes: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """`count`, then [B] eps * sqrt(N): what each row's new priority gets added."""
        return self._bonus * np.sqrt(self.count(hashes, sources))
