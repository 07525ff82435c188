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
        self.prepare(buffer, slot)
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

    def prepare(self, buffer: ReplayBuffer, slot: int) -> None:
        """Before a draw: room for the buffer's staging rows, the slot's new rows at the largest priority, and
        no mass on rows the buffer dropped (a frame-stacked buffer's oldest, see agilerl_core.buffers.frames)."""
        self.resize_staging(buffer.slot_rows)
        written = buffer.written_count(slot)
        self._sync_staged(written)
        dropped = min(written, self.staging) - buffer.staged_count(slot)
        if dropped > 0:
            lost = (written - min(written, self.staging) + np.arange(dropped)) % max(self.staging, 1)
            self.tree.update(self.capacity + lost, np.zeros(dropped))

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


class GroupPriorities:
    """A group's members' priorities side by side for its learn steps: their sum trees become rows of one
    [K, 2 * base] array (each member's tree a view of its row, so they stay the members' own state), every
    member's stratified draw is one descent of [K, B] masses, and the priorities a step learned are one update.
    The values are those each member's :class:`MemberPriorities` gives alone for the same uniforms."""

    def __init__(self, pers: list[MemberPriorities]) -> None:
        self.pers = pers
        self._stack: np.ndarray | None = None
        self._views: list[np.ndarray] = []

    def _trees(self) -> np.ndarray:
        """The members' trees as one array (rebuilt when a member's tree was replaced, e.g. resized)."""
        trees = [p.tree for p in self.pers]
        if self._stack is None or any(t.tree is not v for t, v in zip(trees, self._views, strict=True)):
            if len({t.tree.shape for t in trees}) != 1:
                raise ValueError("prioritised replay: a group's members must have sum trees of one size")
            self._stack = np.stack([t.tree for t in trees])
            self._views = list(self._stack)
            for t, v in zip(trees, self._views, strict=True):
                t.tree = v
        return self._stack

    def sample_rows(self, buffer: ReplayBuffer, slots: list[int], sizes: list[int], betas: list[float],
                    u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every member's stratified draw of ``sizes[i]`` rows (0: it sits out) from uniforms `u` [K, B]:
        (storage rows [K, B], importance weights [K, B] (0 on padding), tree leaves [K, B])."""
        for p, slot, n in zip(self.pers, slots, sizes, strict=True):
            if n:  # as when it draws alone: a member that sits out syncs at its own next draw
                p.prepare(buffer, slot)
        stack = self._trees()
        first = self.pers[0].tree
        k, b = u.shape
        total = stack[:, 1]
        size = np.asarray(sizes, dtype=np.float64)
        active = size > 0
        if (total[active] <= 0).any():
            raise RuntimeError("cannot sample from an empty prioritised buffer")
        mass = (np.arange(b) + u) * (total / np.maximum(size, 1.0))[:, None]
        node = np.ones((k, b), dtype=np.int64)
        while node[0, 0] < first.base:  # every leaf lies at one depth: the members descend in step
            left = np.take_along_axis(stack, 2 * node, 1)
            go_right = mass >= left
            mass -= np.where(go_right, left, 0.0)
            node = 2 * node + go_right
        leaves = np.minimum(node - first.base, first.size - 1)
        cap = self.pers[0].capacity
        slot_base = np.array([buffer.capacity + s * buffer.slot_rows for s in slots])[:, None]
        rows = np.where(leaves < cap, leaves, slot_base + (leaves - cap))
        probs = np.take_along_axis(stack, first.base + leaves, 1) / np.where(total > 0, total, 1.0)[:, None]
        n = np.array([buffer.available(s) for s in slots], dtype=np.float64)[:, None]
        real = np.arange(b) < size[:, None]
        with np.errstate(divide="ignore"):
            weights = np.where(real, (n * probs) ** (-np.asarray(betas)[:, None]), 0.0)
        weights = weights / np.maximum(weights.max(1, keepdims=True), np.finfo(np.float64).tiny)
        return rows, weights, leaves

    def update(self, leaves: np.ndarray, errors: np.ndarray, sizes: list[int]) -> None:
        """New priorities (|error| + eps)^alpha for each member's first ``sizes[i]`` drawn leaves."""
        stack = self._trees()
        width = stack.shape[1]
        base = self.pers[0].tree.base
        members, cols = np.nonzero(np.arange(leaves.shape[1]) < np.asarray(sizes)[:, None])
        alpha = np.array([p.alpha for p in self.pers])[members]
        eps = np.array([p.eps for p in self.pers])[members]
        p = (np.abs(errors[members, cols].astype(np.float64)) + eps) ** alpha
        flat = stack.reshape(-1)
        flat[members * width + base + leaves[members, cols]] = p  # the last value wins for a repeated leaf
        for i, per in enumerate(self.pers):
            mine = members == i
            if mine.any():
                per.max_priority = max(per.max_priority, float(p[mine].max()))
        nodes = np.unique(members * width + (base + leaves[members, cols]) // 2)
        while nodes.size and nodes[0] % width >= 1:
            row, node = np.divmod(nodes, width)
            flat[nodes] = flat[row * width + 2 * node] + flat[row * width + 2 * node + 1]
            if node[0] == 1:
                break
            nodes = np.unique(row * width + node // 2)
