"""Prioritised experience replay (Schaul et al., "Prioritized Experience Replay", ICLR 2016).

Transition i is drawn with probability P(i) = p_i / sum_k p_k, where p_i = (|delta_i| + eps)^alpha is
stored at its last update (new transitions get the largest priority seen so far), and its loss is
weighted by w_i = (N P(i))^-beta / max_j w_j (max over the batch), beta annealed towards 1.

Each member keeps its own priorities (:class:`MemberPriorities`) over the rows it may sample: the
committed ring [0, capacity) plus its own staging rows (leaf ``capacity + j`` is the slot's row j; a slot
that wrapped around gives each overwritten row the largest priority again). They are part of the member's state (its
checkpoint, its clones), so that members never race on a shared structure and the result does not
depend on the runner. Sampling is stratified (one draw per equal segment of the total mass) through a
:class:`SumTree`.
"""

from __future__ import annotations

import numpy as np
import torch

from agilerl_core.buffers.replay import ReplayBuffer


class SumTree:
    """A complete binary tree of float64 sums over `size` leaves; every node is recomputed from its
    two children, so the tree is a pure function of its leaves (rebuilt identically from them)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.base = 1 << max(0, int(np.ceil(np.log2(max(self.size, 1)))))
        self.tree = np.zeros(2 * self.base, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    @property
    def leaves(self) -> np.ndarray:
        return self.tree[self.base: self.base + self.size]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves `idx` to `values` (the last value wins for a repeated index) and refresh their sums."""
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0:
            return
        self.tree[self.base + idx] = np.asarray(values, dtype=np.float64)
        nodes = np.unique((self.base + idx) // 2)
        while nodes.size and nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def set_all(self, values: np.ndarray) -> None:
        """Replace every leaf and rebuild the sums level by level."""
        self.tree[:] = 0.0
        self.tree[self.base: self.base + self.size] = np.asarray(values, dtype=np.float64)
        level = self.base
        while level > 1:
            parents = np.arange(level // 2, level)
            self.tree[parents] = self.tree[2 * parents] + self.tree[2 * parents + 1]
            level //= 2

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index holding each cumulative `mass` (in [0, total)): descend left when the mass fits in
        the left subtree, else subtract it and go right."""
        mass = np.asarray(mass, dtype=np.float64).copy()
        node = np.ones(mass.shape, dtype=np.int64)
        while node[0] < self.base:
            left = 2 * node
            go_right = mass >= self.tree[left]
            mass -= np.where(go_right, self.tree[left], 0.0)
            node = left + go_right
        return np.minimum(node - self.base, self.size - 1)


class MemberPriorities:
    """One member's priorities over the committed ring plus its staging rows."""

    def __init__(self, capacity: int, staging: int, alpha: float, eps: float) -> None:
        self.capacity, self.staging = int(capacity), int(staging)
        self.alpha, self.eps = float(alpha), float(eps)
        self.tree = SumTree(self.capacity + self.staging)
        self.max_priority = 1.0
        self.staged_seen = 0  # staged transitions already given a priority (the slot's written count)

    def resize_staging(self, staging: int) -> None:
        """Make room for a (larger) staging area, keeping the committed priorities."""
        if staging == self.staging:
            return
        committed = self.tree.leaves[: self.capacity].copy()
        self.staging = int(staging)
        self.tree = SumTree(self.capacity + self.staging)
        self.tree.set_all(np.concatenate([committed, np.zeros(self.staging)]))

    def begin_rollout(self) -> None:
        """The member's staging area was emptied: forget its priorities."""
        self.tree.update(np.arange(self.capacity, self.capacity + self.staging),
                         np.zeros(self.staging))
        self.staged_seen = 0

    def committed(self, first: int, count: int, dead: np.ndarray | None = None) -> None:
        """Ring rows [first, first + count) (mod capacity) were just written: new, so max priority; rows `dead`
        (dropped by the buffer) get none."""
        count = min(count, self.capacity)
        rows = (first + np.arange(count)) % self.capacity
        self.tree.update(rows, np.full(count, self.max_priority))
        if dead is not None and len(dead):
            self.tree.update(dead, np.zeros(len(dead)))

    def _sync_staged(self, written: int) -> None:
        """Transitions staged since the last sync enter with the largest priority: slot rows
        ``seen .. written - 1`` (modulo the slot's rows once it wrapped around)."""
        if written > self.staged_seen:
            fresh = np.arange(max(self.staged_seen, written - self.staging), written)
            if written > self.staging:
                fresh = fresh % self.staging
            new = self.capacity + fresh
            self.tree.update(new, np.full(new.size, self.max_priority))
            self.staged_seen = written

    def sample_rows(self, buffer: ReplayBuffer, slot: int, batch_size: int, beta: float,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """A stratified prioritised draw: (storage rows, their importance weights, the tree leaves drawn)."""
        self.resize_staging(buffer.slot_rows)
        written = buffer.written_count(slot)
        self._sync_staged(written)
        dropped = min(written, self.staging) - buffer.staged_count(slot)
        if dropped > 0:  # the buffer dropped the slot's oldest rows (their frames were overwritten): no mass
            lost = (written - min(written, self.staging) + np.arange(dropped)) % max(self.staging, 1)
            self.tree.update(self.capacity + lost, np.zeros(dropped))
        total = self.tree.total
        if total <= 0:
            raise RuntimeError("cannot sample from an empty prioritised buffer")
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64).numpy()
        mass = (np.arange(batch_size) + u) * (total / batch_size)
        leaves = self.tree.find(mass)
        rows = np.where(leaves < self.capacity, leaves,
                        buffer.capacity + slot * buffer.slot_rows + (leaves - self.capacity))
        probs = self.tree.tree[self.tree.base + leaves] / total
        n = buffer.available(slot)
        weights = (n * probs) ** (-beta)
        weights = weights / weights.max()
        weight = torch.as_tensor(weights, dtype=torch.float32).to(buffer.device)
        return torch.as_tensor(rows, dtype=torch.int64).to(buffer.device), weight, leaves

    def update(self, leaves: np.ndarray, errors: np.ndarray) -> None:
        """New priorities (|error| + eps)^alpha for the drawn leaves."""
        p = (np.abs(np.asarray(errors, dtype=np.float64)) + self.eps) ** self.alpha
        self.tree.update(leaves, p)
        self.max_priority = max(self.max_priority, float(p.max()))

    # ---- state: the committed leaves (the staging part is empty between generations) ------------------
    def state(self) -> dict[str, torch.Tensor]:
        return {"per_leaves": torch.as_tensor(self.tree.leaves[: self.capacity].copy()),
                "per_max": torch.tensor([self.max_priority], dtype=torch.float64)}

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        leaves = tensors["per_leaves"].double().numpy()
        if leaves.shape[0] != self.capacity:
            raise ValueError(f"prioritised replay state has {leaves.shape[0]} rows, the buffer {self.capacity}")
        self.tree.set_all(np.concatenate([leaves, np.zeros(self.staging)]))
        self.max_priority = float(tensors["per_max"][0])
        self.staged_seen = 0
