"""A group's state: K members' flat buffers (weights, Adam moments, targets) as [K, P] tensors, member i's
buffer its row i (:func:`stack_flats`; narrower members zero-padded), a group *adopting* members of one shape
(:func:`group_state`, :func:`repoint`: their buffers and parameters become views of its rows), a selection's
children gathered from their parents' rows (:func:`gather_rows`) and the stacked Adam that steps every member at
once (:class:`StackedAdam`). :mod:`agilerl_core.algorithms.group` builds the
groups that learn on it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from agilerl_core.algorithms.optim import FlatAdam
from agilerl_core.networks.stacked import Layers, parameter_blocks

ADAM_STATE = ("flat", "m", "v", "beta1_pow", "beta2_pow")  # a FlatAdam's buffers

Shapes = list[tuple[int, ...]]


def param_shapes(net: torch.nn.Module) -> Shapes:
    return [tuple(p.shape) for p in net.parameters()]


def padded_shapes(shapes: Sequence[Shapes]) -> Shapes:
    """Per parameter, the largest extent of each dimension over the members (their common stacked shape)."""
    return [tuple(max(dims) for dims in zip(*per_param, strict=True)) for per_param in zip(*shapes, strict=True)]


def plain_mlp_shape_key(arch) -> str:
    """A plain MLP's architecture without its hidden widths: members that differ only in widths stack, the
    narrower ones zero-padded (see :func:`stack_flats`)."""
    if arch.rnn is not None:  # a recurrent core's hidden size pads like a width (the head reads it)
        arch = replace(arch, rnn=replace(arch.rnn, hidden=0), mlp=replace(arch.mlp, in_dim=0))
    return repr(replace(arch, mlp=replace(arch.mlp, hidden=(0,) * len(arch.mlp.hidden))))


def stack_flats(flats: Sequence[torch.Tensor], shapes: Sequence[Shapes], padded: Shapes, networks: int = 1
                ) -> torch.Tensor:
    """K flat buffers, each laid out parameter by parameter with its member's `shapes` (`networks` M times over,
    network after network), as one [K, P] state: member i's buffer is row i, each parameter padded to its
    `padded` shape (a narrower member's values in the leading corner, zeros around them). Parameter j of all K
    members is then a [K, *shape] view of the columns it occupies (:func:`~agilerl_core.networks.stacked.
    parameter_blocks`).

    Zero padding is exact for plain MLPs: a padded hidden unit has zero in- and out-weights and bias, so
    its activation is act(0) = 0 (relu, tanh, elu, leaky relu) and every gradient reaching a padded weight
    is 0; Adam then never moves it (its moments stay 0 and its bias-correction powers are 0 here, so
    0 / (0 + eps) = 0). The padded members compute exactly what they compute alone."""
    if all(s == padded for s in shapes):  # nothing to pad: each member's buffer is its row
        return torch.stack(list(flats))
    k, net = len(flats), sum(math.prod(shape) for shape in padded)
    out = torch.zeros((k, networks * net), dtype=flats[0].dtype, device=flats[0].device)
    for i, f in enumerate(flats):
        for src, dst in _padded_views(f, out[i], shapes[i], padded, networks):
            dst.copy_(src)
    return out


def unstack_into(stacked: torch.Tensor, flats: Sequence[torch.Tensor], shapes: Sequence[Shapes],
                 padded: Shapes, networks: int = 1) -> None:
    """The inverse of :func:`stack_flats`, in place into `flats` (a member's buffer that is its row already, an
    adopted member, is left as it is)."""
    for i, f in enumerate(flats):
        if shapes[i] == padded:
            if f.data_ptr() != stacked[i].data_ptr():
                f.copy_(stacked[i])
            continue
        for own, row in _padded_views(f, stacked[i], shapes[i], padded, networks):
            own.copy_(row)


def _row_indices(flats: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """(base, index of each buffer's row) when every buffer of `flats` is a whole row of one contiguous [K, P]
    state `base` (members a group adopted; repeats and any order allowed), else None."""
    base = flats[0]._base
    if base is None or base.dim() != 2 or not base.is_contiguous():
        return None
    width, start, rows = base.shape[1], base.storage_offset(), []
    for f in flats:
        offset = f.storage_offset() - start
        if f._base is not base or tuple(f.shape) != (width,) or offset % width:
            return None
        rows.append(offset // width)
    return base, rows


def rows_of(flats: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The [K, P] state whose rows 0..K-1 `flats` are, in that order (members a group adopted), else None."""
    found = _row_indices(flats)
    if found is None or found[0].shape[0] != len(flats) or found[1] != list(range(len(flats))):
        return None
    return found[0]


def gather_rows(flats: Sequence[torch.Tensor]) -> torch.Tensor:
    """[S, P], row s a copy of ``flats[s]`` (a buffer may come more than once: a tournament's picks), in one op:
    an index gather from the [K, P] state the buffers are rows of (members a group adopted), else a stack."""
    found = _row_indices(flats)
    if found is None:
        return torch.stack(list(flats))
    base, rows = found
    return base.index_select(0, torch.tensor(rows, device=base.device))


def group_state(flats: Sequence[torch.Tensor], shapes: Sequence[Shapes], padded: Shapes, networks: int = 1
                ) -> tuple[torch.Tensor, bool]:
    """The [K, P] state of K members' buffers: the state they are rows of already (no copy), or a new one
    (:func:`stack_flats`). Returns (state, whether the members may be re-pointed to its rows: every member at
    the padded shape)."""
    whole = all(s == padded for s in shapes)
    base = rows_of(flats) if whole else None
    return (base if base is not None else stack_flats(flats, shapes, padded, networks)), whole


@torch.no_grad()
def repoint(params: Sequence[torch.Tensor], old: torch.Tensor, new: torch.Tensor) -> None:
    """Every parameter of `params` that is a view of buffer `old` becomes the same view of `new` (a buffer laid
    out as `old`, holding the same values): a member's networks then read and train the group's row."""
    ptr, start, n = old.untyped_storage().data_ptr(), old.storage_offset(), old.numel()
    for p in params:
        offset = p.storage_offset() - start
        if p.untyped_storage().data_ptr() == ptr and 0 <= offset < n:
            p.data = new.as_strided(p.shape, p.stride(), new.storage_offset() + offset)


def _padded_views(own: torch.Tensor, row: torch.Tensor, shapes: Shapes, padded: Shapes, networks: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each parameter of each network in a member's own buffer and in its padded row: (own view, the leading
    corner of the row's view)."""
    pairs, i, j = [], 0, 0
    for _ in range(networks):
        for shape, big in zip(shapes, padded, strict=True):
            n, m = math.prod(shape), math.prod(big)
            pairs.append((own[i: i + n].view(shape), row[j: j + m].view(big)[tuple(slice(0, d) for d in shape)]))
            i, j = i + n, j + m
    return pairs


def stacked_blocks(flat: torch.Tensor, k: int, padded: Shapes) -> Layers:
    """The (weight [K, out, in], bias [K, out]) blocks of a stacked plain-MLP state [K, P], in layer order."""
    views = parameter_blocks(flat, k, padded)
    return list(zip(views[0::2], views[1::2], strict=True))


class StackedAdam:
    """The Adam states of K members' copies of one network, stacked: one step for the group. Learning rates
    are per member; a member left out of a step (``active``) keeps its weights and moments exactly."""

    def __init__(self, opts: Sequence[FlatAdam], shapes: Sequence[Shapes], networks_per_member: int = 1) -> None:
        """`opts`: each member's Adam; `shapes`: each member's parameter shapes in its flat buffer's order.
        With `networks_per_member` M > 1 each member's Adam steps M networks of those shapes, one after another
        in its buffer (:func:`~agilerl_core.algorithms.optim.stack_parameters`), and gradient clipping is per
        network, as that Adam clips alone. Every state tensor is [K, P]: member i's buffer is row i."""
        first = opts[0]
        if any(o.betas != first.betas or o.eps != first.eps for o in opts):
            raise ValueError("a group's members must share Adam betas and eps")
        self.opts = list(opts)
        self.k = len(opts)
        self.shapes = list(shapes)
        self.padded = padded_shapes(self.shapes)
        self.networks = networks_per_member
        self.betas, self.eps = first.betas, first.eps
        for name in ADAM_STATE:
            own = [getattr(o, name) for o in opts]
            state, adopt = group_state(own, self.shapes, self.padded, networks_per_member)
            if adopt:  # each member's buffer becomes its row (its networks' parameters with it)
                for o, buffer, row in zip(opts, own, state, strict=True):
                    if buffer is not row:
                        if name == "flat":
                            repoint([p for m in o.modules for p in m.parameters()], buffer, row)
                        setattr(o, name, row)
            setattr(self, name, state)
        self.grad = torch.zeros_like(self.flat)
        device = self.flat.device
        # each element's network (member i's networks are i*M .. i*M+M-1), for per-network clipping
        self._clip_owner = torch.arange(self.k * networks_per_member, device=device).repeat_interleave(
            self.flat.shape[1] // networks_per_member)
        self.lr = torch.tensor([o.lr for o in opts], dtype=torch.float32, device=device)
        self._lr_el = self.lr.unsqueeze(1)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float, extra: torch.Tensor | None = None) -> torch.Tensor:
        """Scale each member's (network's) gradient to a norm of at most `max_norm` (as FlatAdam.clip_grad_norm
        on its own). `extra` [K, ...]: each member's gradients of parameters outside the stack (PPO's log_std),
        counted in its norm and scaled with it (one network per member only). Returns each member's gradient
        norm before clipping [K] (all its networks together)."""
        owner = self._clip_owner
        sq = torch.zeros(self.k * self.networks, device=self.grad.device).index_add_(0, owner,
                                                                                  (self.grad * self.grad).view(-1))
        if extra is not None:
            if self.networks != 1:
                raise ValueError("extra gradients are clipped with a stack of one network per member")
            sq = sq + extra.reshape(self.k, -1).pow(2).sum(1)
        norm = sq.sqrt()
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        self.grad.view(self.k * self.networks, -1).mul_(scale.unsqueeze(1))
        if extra is not None:
            extra.mul_(scale.view(self.k, *([1] * (extra.dim() - 1))))
        return norm if self.networks == 1 else sq.view(self.k, self.networks).sum(1).sqrt()

    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """Each member's gradient norm [K] (all its networks together)."""
        return torch.linalg.vector_norm(self.grad, dim=1)

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """One Adam step of every member (`active` None) or of the members where `active` [K] is True."""
        b1, b2 = self.betas
        if active is None:
            self.beta1_pow.mul_(b1)
            self.beta2_pow.mul_(b2)
            self.m.lerp_(self.grad, 1.0 - b1)
            self.v.mul_(b2).addcmul_(self.grad, self.grad, value=1.0 - b2)
            denom = self.v.div(torch.rsub(self.beta2_pow, 1.0)).sqrt_().add_(self.eps)
            self.flat.sub_(self.m.div(torch.rsub(self.beta1_pow, 1.0)).mul_(self._lr_el).div_(denom))
            return
        on = active.unsqueeze(1)
        a = on.to(self.flat.dtype)
        self.beta1_pow.mul_(torch.where(on, b1, 1.0))
        self.beta2_pow.mul_(torch.where(on, b2, 1.0))
        self.m.lerp_(self.grad, a * (1.0 - b1))
        self.v.mul_(1.0 - a * (1.0 - b2)).addcmul_(self.grad * a, self.grad, value=1.0 - b2)
        denom = self.v.div(1.0 - self.beta2_pow).sqrt_().add_(self.eps)
        update = self.m.div(1.0 - self.beta1_pow).mul_(self._lr_el).div_(denom)
        self.flat.sub_(torch.where(on, update, 0.0))  # where: a never-stepped member's 0/0 stays out

    @torch.no_grad()
    def write_back(self) -> None:
        for name in ADAM_STATE:
            unstack_into(getattr(self, name), [getattr(o, name) for o in self.opts], self.shapes, self.padded,
                         self.networks)
