"""Prioritised experience replay (Schaul et al., "Prioritized Experience Replay", ICLR 2016).

Transition i is drawn with probability P(i) = p_i / sum_k p_k, where p_i = (|delta_i| + eps)^alpha is
stored at its last update (new transitions get the largest priority seen so far), and its loss is
weighted by w_i = (N P(i))^-beta / max_j w_j (max over the batch), beta annealed towards 1.

Each member keeps its own priorities (:class:`MemberPriorities`) over the rows it may sample: the
committed ring [0, capacity) plus its own staging rows (leaf ``capacity + j`` is the slot's row j; a slot
that wrapped around gives each overwritten row the largest priority again). They are part of the member's state (its
checkpoint, its clones), so that members never race on a shared structure and the result does not
depend on the runner. Sampling is stratified (one draw per equal segment of the total mass) through a
:class:`SumTree`. Every tree is a float64 tensor on the member's device: a group's draw, its priority update
and the new rows' entry are tensor ops (no host read in a learn step).
"""

from __future__ import annotations

import torch

from agilerl_core.buffers.replay import ReplayBuffer


class SumTree:
    """A complete binary tree of float64 sums over `size` leaves (a tensor, root at 1, leaves from `base`);
    every node is recomputed from its two children, so the tree is a pure function of its leaves (rebuilt
    identically from them)."""

    def __init__(self, size: int, device: torch.device | str = "cpu") -> None:
        self.size = int(size)
        self.depth = max(0, (max(self.size, 1) - 1).bit_length())
        self.base = 1 << self.depth
        self.tree = torch.zeros(2 * self.base, dtype=torch.float64, device=device)

    @property
    def leaves(self) -> torch.Tensor:
        return self.tree[self.base: self.base + self.size]

    @property
    def total(self) -> torch.Tensor:
        """The sum of every leaf (a 0-d tensor: read it only where a host number is needed)."""
        return self.tree[1]

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """The leaf holding each cumulative `mass` (in [0, total)), as :func:`descend` finds it."""
        return descend(self.tree.unsqueeze(0), mass.reshape(1, -1), self.depth, self.size)[0].view(mass.shape)

    def update(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves `idx` to `values` (the last value wins for a repeated index) and refresh their sums."""
        set_leaves(self.tree.unsqueeze(0), self.base, self.depth, torch.zeros_like(idx), idx, values)

    def set_all(self, values: torch.Tensor) -> None:
        """Replace every leaf and rebuild the sums level by level."""
        self.tree.zero_()
        self.tree[self.base: self.base + self.size] = values
        level = self.base
        while level > 1:
            self.tree[level // 2: level] = self.tree[level: 2 * level: 2] + self.tree[level + 1: 2 * level: 2]
            level //= 2


def descend(trees: torch.Tensor, mass: torch.Tensor, depth: int, size: int) -> torch.Tensor:
    """The leaf [K, B] of each tree [K, 2 * base] holding each cumulative mass [K, B]: from the root, go left when
    the mass fits in the left subtree, else subtract it and go right (every leaf lies at one depth: all trees
    descend in step)."""
    node = torch.ones(mass.shape, dtype=torch.int64, device=trees.device)
    mass = mass.to(torch.float64)
    for _ in range(depth):
        left = trees.gather(1, 2 * node)
        go_right = mass >= left
        mass = mass - torch.where(go_right, left, 0.0)
        node = 2 * node + go_right
    return (node - (1 << depth)).clamp(max=size - 1)


def set_leaves(trees: torch.Tensor, base: int, depth: int, rows: torch.Tensor, leaves: torch.Tensor,
               values: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """In the trees [K, 2 * base], set leaf ``leaves[j]`` of tree ``rows[j]`` to ``values[j]`` (the last value wins
    for a repeated one; entries where `valid` is False are left out) and recompute the sums above them, level by
    level. No host read: a left-out or overwritten write goes to its tree's unused node 0, and a repeated parent is
    written twice with the same sum."""
    if leaves.numel() == 0:
        return
    width = trees.shape[1]
    flat = trees.view(-1)
    scratch = rows * width  # node 0 of each tree: never read (the root is node 1)
    ok = torch.ones_like(leaves, dtype=torch.bool) if valid is None else valid
    at = torch.where(ok, scratch + base + leaves, scratch)
    order = torch.argsort(at, stable=True)  # the last write of each leaf, in the order given
    sorted_at = at[order]
    last = torch.ones_like(sorted_at, dtype=torch.bool)
    last[:-1] = sorted_at[1:] != sorted_at[:-1]
    flat[torch.where(last, sorted_at, scratch[order])] = values.to(flat.dtype)[order]
    node = torch.where(ok, (base + leaves) // 2, 0)
    for _ in range(depth):
        flat[scratch + node] = flat[scratch + 2 * node] + flat[scratch + 2 * node + 1]
        node = node // 2


class MemberPriorities:
    """One member's priorities over the committed ring plus its staging rows."""

    def __init__(self, capacity: int, staging: int, alpha: float, eps: float,
                 device: torch.device | str = "cpu") -> None:
        self.capacity, self.staging = int(capacity), int(staging)
        self.alpha, self.eps = float(alpha), float(eps)
        self.device = torch.device(device)
        self.tree = SumTree(self.capacity + self.staging, self.device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self.staged_seen = 0  # staged transitions already given a priority (the slot's written count)

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, device=self.device)

    def resize_staging(self, staging: int) -> None:
        """Make room for a (larger) staging area, keeping the committed priorities."""
        if staging == self.staging:
            return
        committed = self.tree.leaves[: self.capacity].clone()
        self.staging = int(staging)
        self.tree = SumTree(self.capacity + self.staging, self.device)
        self.tree.set_all(torch.cat([committed, committed.new_zeros(self.staging)]))

    def begin_rollout(self) -> None:
        """The member's staging area was emptied: forget its priorities."""
        rows = self._rows(self.capacity, self.capacity + self.staging)
        self.tree.update(rows, torch.zeros(rows.shape, dtype=torch.float64, device=self.device))
        self.staged_seen = 0

    def committed(self, first: int, count: int, dead: torch.Tensor | None = None) -> None:
        """Ring rows [first, first + count) (mod capacity) were just written: new, so max priority; rows `dead`
        (dropped by the buffer) get none."""
        count = min(count, self.capacity)
        rows = (first + self._rows(0, count)) % self.capacity
        self.tree.update(rows, self.max_priority.expand(count))
        if dead is not None and len(dead):
            dead = torch.as_tensor(dead, dtype=torch.int64, device=self.device)
            self.tree.update(dead, torch.zeros(dead.shape, dtype=torch.float64, device=self.device))

    def _sync_staged(self, written: int) -> None:
        """Transitions staged since the last sync enter with the largest priority: slot rows
        ``seen .. written - 1`` (modulo the slot's rows once it wrapped around)."""
        if written > self.staged_seen:
            fresh = self._rows(max(self.staged_seen, written - self.staging), written)
            if written > self.staging:
                fresh = fresh % self.staging
            self.tree.update(self.capacity + fresh, self.max_priority.expand(fresh.shape[0]))
            self.staged_seen = written

    def prepare(self, buffer: ReplayBuffer, slot: int) -> None:
        """Before a draw: room for the buffer's staging rows, the slot's new rows at the largest priority, and
        no mass on rows the buffer dropped (a frame-stacked buffer's oldest, see agilerl_core.buffers.frames)."""
        self.resize_staging(buffer.slot_rows)
        written = buffer.written_count(slot)
        self._sync_staged(written)
        dropped = min(written, self.staging) - buffer.staged_count(slot)
        if dropped > 0:
            lost = (written - min(written, self.staging) + self._rows(0, dropped)) % max(self.staging, 1)
            self.tree.update(self.capacity + lost, torch.zeros(dropped, dtype=torch.float64, device=self.device))

    # ---- state: the committed leaves (the staging part is empty between generations) ------------------
    def state(self) -> dict[str, torch.Tensor]:
        return {"per_leaves": self.tree.leaves[: self.capacity].cpu().clone(),
                "per_max": self.max_priority.reshape(1).cpu().clone()}

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        leaves = tensors["per_leaves"].to(torch.float64)
        if leaves.dim() != 1 or leaves.shape[0] != self.capacity:
            raise ValueError(f"prioritised replay state has {tuple(leaves.shape)} rows, the buffer {self.capacity}")
        leaves = leaves.to(self.device)
        self.tree.set_all(torch.cat([leaves, leaves.new_zeros(self.staging)]))
        self.max_priority = tensors["per_max"].to(torch.float64).reshape(-1)[0].to(self.device).clone()
        self.staged_seen = 0


class GroupPriorities:
    """A group's members' priorities side by side for its learn steps: their sum trees become rows of one
    [K, 2 * base] tensor (each member's tree a view of its row, so they stay the members' own state), every
    member's stratified draw is one descent of [K, B] masses, and the priorities a step learned are one update.
    A member alone is a group of one."""

    def __init__(self, pers: list[MemberPriorities]) -> None:
        self.pers = pers
        self._stack: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        dev = pers[0].device
        self.alpha = torch.tensor([p.alpha for p in pers], dtype=torch.float64, device=dev)
        self.eps = torch.tensor([p.eps for p in pers], dtype=torch.float64, device=dev)
        self.empty = torch.zeros(len(pers), dtype=torch.bool, device=dev)  # drew from a tree without mass
        self._consts: dict[tuple, torch.Tensor] = {}

    def _const(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """`values` on the device, made once per distinct value (no copy to the device per step)."""
        key = (tuple(values), dtype)
        if key not in self._consts:
            self._consts[key] = torch.tensor(key[0], dtype=dtype, device=self.alpha.device)
        return self._consts[key]

    def check(self) -> None:
        """Raise when a member drew from a tree that held no mass (one read, at the end of a phase)."""
        if bool(self.empty.any()):
            raise RuntimeError("cannot sample from an empty prioritised buffer")

    def _trees(self) -> torch.Tensor:
        """The members' trees as one tensor (rebuilt when a member's tree was replaced, e.g. resized)."""
        trees = [p.tree for p in self.pers]
        if self._stack is None or any(t.tree is not v for t, v in zip(trees, self._views, strict=True)):
            if len({tuple(t.tree.shape) for t in trees}) != 1:
                raise ValueError("prioritised replay: a group's members must have sum trees of one size")
            self._stack = torch.stack([t.tree for t in trees])
            self._views = list(self._stack.unbind(0))
            for t, v in zip(trees, self._views, strict=True):
                t.tree = v
        return self._stack

    def sample_rows(self, buffer: ReplayBuffer, slots: list[int], sizes: list[int], betas: torch.Tensor,
                    u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every member's stratified draw of ``sizes[i]`` rows (0: it sits out) from uniforms `u` [K, B] at its
        ``betas[i]`` [K]: (storage rows [K, B], importance weights [K, B] (0 on padding), tree leaves [K, B]).
        A member whose tree holds no mass draws leaf 0 with weight 0 and is remembered (:meth:`check`)."""
        for p, slot, n in zip(self.pers, slots, sizes, strict=True):
            p.resize_staging(buffer.slot_rows)  # every tree one size (room only: its staging leaves stay empty)
            if n:  # as when it draws alone: a member that sits out syncs at its own next draw
                p.prepare(buffer, slot)
        stack = self._trees()
        first = self.pers[0].tree
        dev = stack.device
        b = u.shape[1]
        total = stack[:, 1]
        size = self._const(sizes, torch.float64)
        self.empty |= (total <= 0) & (size > 0)
        mass = (torch.arange(b, dtype=torch.float64, device=dev) + u.to(torch.float64)) * \
            (total / size.clamp(min=1.0)).unsqueeze(1)
        leaves = descend(stack, mass, first.depth, first.size)
        cap = self.pers[0].capacity
        slot_base = self._const([buffer.capacity + s * buffer.slot_rows for s in slots], torch.int64).unsqueeze(1)
        rows = torch.where(leaves < cap, leaves, slot_base + (leaves - cap))
        probs = stack.gather(1, first.base + leaves) / torch.where(total > 0, total, 1.0).unsqueeze(1)
        n = self._const([buffer.available(s) for s in slots], torch.float64).unsqueeze(1)
        real = torch.arange(b, device=dev) < size.unsqueeze(1)
        weights = torch.where(real, (n * probs).pow(-betas.to(torch.float64).unsqueeze(1)), 0.0)
        weights = torch.where(real & (probs > 0), weights, 0.0)
        weights = weights / weights.amax(1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
        return rows, weights, leaves

    def update(self, leaves: torch.Tensor, errors: torch.Tensor, sizes: list[int]) -> None:
        """New priorities (|error| + eps)^alpha for each member's first ``sizes[i]`` drawn leaves [K, B]."""
        stack = self._trees()
        k, b = leaves.shape
        real = torch.arange(b, device=stack.device) < self._const(sizes, torch.int64).unsqueeze(1)
        p = (errors.to(torch.float64).abs() + self.eps.unsqueeze(1)).pow(self.alpha.unsqueeze(1))
        members = torch.arange(k, device=stack.device).unsqueeze(1).expand(k, b)
        set_leaves(stack, self.pers[0].tree.base, self.pers[0].tree.depth, members.reshape(-1), leaves.reshape(-1),
                   p.reshape(-1), real.reshape(-1))
        top = torch.where(real, p, 0.0).amax(1)
        for i, per in enumerate(self.pers):
            if sizes[i]:
                per.max_priority = torch.maximum(per.max_priority, top[i])
