"""A sum tree: draws leaves in proportion to their weights, for prioritized replay."""

import numpy as np


class SumTree:
    """Sums of leaf weights, to draw leaves in proportion to their weight.

    Node 1 is the root, node i's children are 2i and 2i + 1, and leaf j is
    node P + j, with P the capacity padded to a power of two (the padding
    weighs 0). Parents are recomputed from their children, never adjusted
    by differences, so rounding does not build up over millions of updates.
    """

    def __init__(self, capacity: int):
        self._leaves = 1 << max(0, (capacity - 1).bit_length())
        self._depth = self._leaves.bit_length() - 1
        self._nodes = np.zeros(2 * self._leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self._nodes[1])

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Leaves `indices` weigh `values` (the last of repeated indices wins)."""
        if len(indices) == 0:
            return
        nodes = np.asarray(indices, np.int64) + self._leaves
        self._nodes[nodes] = values
        for _ in range(self._depth):
            nodes = np.unique(nodes >> 1)
            self._nodes[nodes] = self._nodes[2 * nodes] + self._nodes[2 * nodes + 1]

    def set_all(self, values: np.ndarray) -> None:
        """Every leaf at once (padding 0), the sums level by level."""
        self._nodes[:] = 0.0
        self._nodes[self._leaves : self._leaves + len(values)] = values
        level = self._leaves
        while level > 1:
            children = self._nodes[level : 2 * level]
            self._nodes[level // 2 : level] = children[0::2] + children[1::2]
            level //= 2

    def find(self, targets: np.ndarray) -> np.ndarray:
        """[n] the leaf whose interval of the cumulative weights holds each target.

        Targets are in [0, total). Rounding can leave a target at or past the
        sum of the subtree it descends into (a total drawn as total * u with
        u near 1, sums that differ in their last bit); such a target would
        land on a leaf of weight 0, a slot that holds nothing. The descent
        never enters a subtree of weight 0 instead, and one clamped to the
        left stays within its weight: every leaf found weighs more than 0
        while the total does.
        """
        nodes = np.ones(len(targets), np.int64)
        remaining = np.asarray(targets, np.float64).copy()
        for _ in range(self._depth):
            left = 2 * nodes
            left_sum = self._nodes[left]
            right_sum = self._nodes[left + 1]
            right = ((remaining >= left_sum) & (right_sum > 0)) | (left_sum <= 0)
            remaining = np.where(right, remaining - left_sum, np.minimum(remaining, left_sum))
            nodes = np.where(right, left + 1, left)
        return nodes - self._leaves
