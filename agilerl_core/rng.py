"""Counter-based random numbers for a whole group at once: every value is a hash of (key, counter, element),
so a member's stream depends only on its own key, never on who shares its group or in what order the group
draws, and a group's draws are one elementwise op on its device (no per-member generator calls, no host
round trip).

Each value is SplitMix64 (Steele, Lea and Flood, OOPSLA 2014) seeded by the key, at index counter * 2^32 +
element: one finaliser over key + index * golden ratio, in int64 torch ops (multiplication wraps modulo 2^64
on every backend; right shifts are made logical by masking). SplitMix64 passes BigCrush; keys are random
62-bit draws (or mixed seeds), so two streams overlap only if their keys collide. Floats take the top 24
bits, so a uniform is one of 2^24 evenly spaced values in [0, 1).

A member's key for a training phase is drawn once from its own checkpointed generator
(:func:`member_keys`), so a resumed run draws exactly what an uninterrupted one does; within the phase the
counter is the step (or round) number.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_M1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9 as a signed int64
_M2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 `x` by `s` bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _xorshift_(x: torch.Tensor, s: int) -> torch.Tensor:
    """x ^= x >>> s (logical shift), in place."""
    y = x >> s
    y &= (1 << (64 - s)) - 1
    return x.bitwise_xor_(y)


def mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser, elementwise on int64 (a bijection of the 64-bit integers)."""
    x = x ^ _shr(x, 30)  # a new tensor; the rest works in place on it
    x.mul_(_M1)
    _xorshift_(x, 27).mul_(_M2)
    return _xorshift_(x, 31)


_GOLDEN_32 = ((_GOLDEN << 32) + 2**63) % 2**64 - 2**63  # golden * 2^32 as a wrapped int64
_STEPS: dict[tuple[int, torch.device], torch.Tensor] = {}  # j * golden for j < n, per (n, device)


def _golden_steps(n: int, device: torch.device) -> torch.Tensor:
    steps = _STEPS.get((n, device))
    if steps is None:
        steps = _STEPS[(n, device)] = torch.arange(n, dtype=torch.int64, device=device) * _GOLDEN
    return steps


def bits(key: torch.Tensor | int, counter: torch.Tensor | int, n: int, device: torch.device | str | None = None
         ) -> torch.Tensor:
    """64 random bits (int64) per element: [*broadcast(key, counter), n], element j of each from SplitMix64
    seeded by `key` at index counter * 2^32 + j (one finaliser per value)."""
    key = torch.as_tensor(key, dtype=torch.int64, device=device)
    counter = torch.as_tensor(counter, dtype=torch.int64, device=key.device)
    # key + (counter * 2^32 + j) * golden, wrapping modulo 2^64 as SplitMix64 does
    return mix((key + counter * _GOLDEN_32).unsqueeze(-1) + _golden_steps(n, key.device))


def uniform(key: torch.Tensor | int, counter: torch.Tensor | int, n: int,
            device: torch.device | str | None = None) -> torch.Tensor:
    """Uniform float32 in [0, 1), [*broadcast(key, counter), n]."""
    return _shr(bits(key, counter, n, device), 40).to(torch.float32) * (1.0 / (1 << 24))


def below(key: torch.Tensor | int, counter: torch.Tensor | int, n: int, bound: torch.Tensor | int,
          device: torch.device | str | None = None) -> torch.Tensor:
    """Uniform integers in [0, bound) (int64), [*broadcast(key, counter), n]: 63 random bits modulo `bound`
    (broadcast against the leading dims; >= 1), a bias below bound / 2^63."""
    x = bits(key, counter, n, device)
    x >>= 1
    x &= (1 << 63) - 1
    if isinstance(bound, int):  # one bound for all: a scalar argument, no tensor to copy to the device
        return x.remainder_(max(bound, 1))
    return x.remainder_(torch.as_tensor(bound, dtype=torch.int64, device=x.device).clamp(min=1).unsqueeze(-1))


def normal(key: torch.Tensor | int, counter: torch.Tensor | int, n: int,
           device: torch.device | str | None = None) -> torch.Tensor:
    """Standard normal float32 (Box-Muller on two uniforms from the same key and counter), [..., n]; element j
    depends only on (key, counter, j), not on n."""
    u = uniform(key, counter, 2 * n, device)  # element j from the pair (2j, 2j + 1): independent of n
    u1 = 1.0 - u[..., 0::2]  # (0, 1]: log is finite
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * torch.pi) * u[..., 1::2])


def member_keys(generators: Sequence[torch.Generator], device: torch.device | str) -> torch.Tensor:
    """One 62-bit key per member [K] (int64 on `device`), each drawn from that member's own generator: the
    keys of a training phase (one draw per member per phase, outside the loop)."""
    return torch.cat([torch.randint(0, 2**62, (1,), generator=g) for g in generators]).to(device)


SALT_SAMPLE, SALT_NOISE = 0x5A3C_0001, 0x5A3C_0002  # the per-member draw kinds of a learn step
SALT_NOISY = 0x5A3C_0003  # noisy networks' parameter noise (acting and learning)
SALT_SDE = 0x5A3C_0004  # gSDE's exploration weights (acting)


class MemberDraws:
    """Draws a member takes only when it takes part (a learn step's minibatch, its target noise): member i's
    values come from a key derived from its phase key and `salt`, at a counter that counts its own draws of
    this kind, so they do not depend on how many rounds others in its group took."""

    def __init__(self, keys: torch.Tensor, salt: int) -> None:
        self.keys = mix(keys ^ salt)
        self.count = torch.zeros_like(keys)

    def _advance(self, who: torch.Tensor) -> torch.Tensor:
        counter = self.count
        self.count = self.count + who.to(torch.int64)
        return counter

    def below(self, who: torch.Tensor, n: int, bound: torch.Tensor) -> torch.Tensor:
        """[K, n] integers in [0, bound[i]) for each member (`who` [K] bool: who advances)."""
        return below(self.keys, self._advance(who), n, bound)

    def normal(self, who: torch.Tensor, n: int) -> torch.Tensor:
        """[K, n] standard normals."""
        return normal(self.keys, self._advance(who), n)

    def uniform(self, who: torch.Tensor, n: int) -> torch.Tensor:
        """[K, n] uniforms in [0, 1)."""
        return uniform(self.keys, self._advance(who), n)


class KeyedStream:
    """A group's random draws for one phase: member i's values come from its key `keys[i]` and a counter that
    advances with every draw, so member i draws the same values in any group. Shapes are per member."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys
        self.counter = 0

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def uniform(self, *shape: int) -> torch.Tensor:
        """[K, *shape] uniforms in [0, 1)."""
        n = 1
        for d in shape:
            n *= d
        return uniform(self.keys, self._next(), n).view(-1, *shape)

    def normal(self, *shape: int) -> torch.Tensor:
        """[K, *shape] standard normals."""
        n = 1
        for d in shape:
            n *= d
        return normal(self.keys, self._next(), n).view(-1, *shape)

    def permutations(self, n: int) -> torch.Tensor:
        """[K, n] long: a uniformly random permutation of range(n) per member (argsort of uniforms; ties,
        rare at 2^-24 spacing, break by index)."""
        return torch.argsort(self.uniform(n), dim=1, stable=True)
