"""Spaces as data: what a checkpoint records instead of naming code that would rebuild its env.

:func:`space_to_dict` / :func:`space_from_dict` turn a Box, Discrete or Dict of those into plain JSON data and
back; :func:`obs_spec_to_dict` / :func:`obs_spec_from_dict` do the same for a whole
:class:`~agilerl_core.envs.spaces.ObsSpec` or :class:`~agilerl_core.envs.spaces.MultiAgentSpec` (with an image's
scaling where it is not the one its space implies). Reading is data only (nothing named is imported or called),
and every size is checked against the limit table (:func:`space_elements`) before anything is allocated.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from agilerl_core.envs.spaces import IMAGE_SCALES, ActionSpec, ImageScale, MultiAgentSpec, ObsSpec, image_scale
from agilerl_core.errors import ConfigError

_SPACE_DTYPES = {"uint8", "int8", "int32", "int64", "float16", "float32", "float64", "bool"}


def space_to_dict(space: spaces.Space) -> dict:
    """A Box, Discrete or Dict of those as plain JSON data (bounds, shape, dtype, n)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        def bound(x: np.ndarray) -> list:
            return [None if not np.isfinite(v) else float(v) for v in np.asarray(x, np.float64).reshape(-1)]
        return {"type": "Box", "shape": [int(s) for s in space.shape], "dtype": np.dtype(space.dtype).name,
                "low": bound(space.low), "high": bound(space.high),
                "low_inf": [bool(np.isneginf(v)) for v in np.asarray(space.low, np.float64).reshape(-1)]}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {str(k): space_to_dict(s) for k, s in space.spaces.items()}}
    raise ValueError(f"{type(space).__name__} spaces cannot be recorded; supported: Box, Discrete, Dict")


def space_elements(d: object, where: str = "space") -> int:
    """Elements of the space dict `d` (a Box's shape product, Discrete 1, a Dict's sub-spaces summed), read from
    the data alone and checked against ``limits.space_elements`` (and ``limits.discrete_n`` for a Discrete's n)
    before any bound array is built; a ValueError naming `where` and the field otherwise."""
    from agilerl_core.limits import check, current

    lim = current()
    total, stack = 0, [(d, where)]
    while stack:  # no recursion: a record's nesting is bounded, but this stays flat anyway
        node, at = stack.pop()
        if not isinstance(node, dict):
            raise ValueError(f"{at}: expected an object, found {type(node).__name__}")
        kind = node.get("type")
        try:
            if kind == "Discrete":
                check("discrete_n", node.get("n"), f"{at}.n", limits=lim)
                total += 1
            elif kind == "Box":
                shape = node.get("shape")
                if not isinstance(shape, list):
                    raise ValueError(f"{at}.shape: expected a list, found {type(shape).__name__}")
                size = 1
                for i, n in enumerate(shape):
                    size *= check("space_elements", n, f"{at}.shape[{i}]", limits=lim)
                    check("space_elements", size, f"{at}.shape (elements)", limits=lim)
                total += size
            elif kind == "Dict":
                subs = node.get("spaces")
                if not isinstance(subs, dict):
                    raise ValueError(f"{at}.spaces: expected an object, found {type(subs).__name__}")
                stack += [(v, f"{at}.{k}") for k, v in subs.items()]
            else:
                raise ValueError(f"{at}: unknown space type {kind!r} (expected Box, Discrete or Dict)")
            check("space_elements", total, f"{where} (elements of all its sub-spaces)", limits=lim)
        except ConfigError as err:
            raise ValueError(str(err)) from None
    return total


def space_from_dict(d: object, where: str = "space") -> spaces.Space:
    """Inverse of :func:`space_to_dict`. Only plain data is read: nothing named in `d` is imported or called;
    anything unexpected raises a ValueError naming `where`; sizes are checked (:func:`space_elements`) before
    anything is allocated."""
    space_elements(d, where)
    return _space_from_dict(d, where)


def _space_from_dict(d: object, where: str) -> spaces.Space:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, found {type(d).__name__}")
    kind = d.get("type")
    try:
        if kind == "Discrete":
            return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
        if kind == "Box":
            dtype = str(d["dtype"])
            if dtype not in _SPACE_DTYPES:
                raise ValueError(f"dtype {dtype!r} is not one of {sorted(_SPACE_DTYPES)}")
            shape = tuple(int(s) for s in d["shape"])
            size = int(np.prod(shape)) if shape else 1
            if not all(isinstance(d.get(k, []), list) for k in ("low", "high", "low_inf")):
                raise ValueError("low, high and low_inf must be lists")
            low_inf = list(d.get("low_inf") or [False] * size)
            if len(d["low"]) != size or len(d["high"]) != size or len(low_inf) != size:
                raise ValueError(f"bounds do not have {size} entries")
            low = np.array([(-np.inf if neg else np.inf) if v is None else float(v)
                            for v, neg in zip(d["low"], low_inf, strict=True)], np.float64)
            high = np.array([np.inf if v is None else float(v) for v in d["high"]], np.float64)
            dt = np.dtype(dtype)
            return spaces.Box(low.reshape(shape).astype(dt), high.reshape(shape).astype(dt), shape, dtype=dt)
        if kind == "Dict":
            return spaces.Dict({str(k): _space_from_dict(v, f"{where}.{k}") for k, v in dict(d["spaces"]).items()})
    except (KeyError, TypeError, OverflowError, AssertionError, AttributeError) as err:
        raise ValueError(f"{where}: malformed {kind} space ({err!r})") from None
    raise ValueError(f"{where}: unknown space type {kind!r} (expected Box, Discrete or Dict)")


def obs_spec_to_dict(spec: ObsSpec | MultiAgentSpec) -> dict:
    """What rebuilding a member needs to know about its env, as data: the observation space(s), per agent
    with their action spaces for a team."""
    if isinstance(spec, MultiAgentSpec):
        return {"kind": "multi_agent", "agents": list(spec.agents),
                "observation_spaces": {a: space_to_dict(spec.obs[a].space) for a in spec.agents},
                "actions": {a: spec.actions[a].to_dict() for a in spec.agents}}
    d = {"kind": "single", "observation_space": space_to_dict(spec.space),
         "channels_last": spec.parts[0].channels_last if spec.image_parts and not spec.is_dict else None}
    # An image's scaling follows from its recorded space (image_scale); only a spec built with another mode
    # records it, so every other spec reads (and compares, same_spec) exactly as before.
    auto = _auto_scales(spec)
    if any(p.scale != auto[p.key] for p in spec.image_parts):
        d["image_scale"] = spec.image_scales
        tops = {p.key: list(p.top) for p in spec.image_parts if p.scale == "observed"}
        if tops:
            d["image_top"] = tops
    return d


def _auto_scales(spec: ObsSpec) -> dict[str, ImageScale]:
    """The scaling :func:`image_scale` picks for each image key of `spec`'s space."""
    space = spec.space
    return {p.key: image_scale(space[p.key] if spec.is_dict else space) for p in spec.image_parts}


def obs_spec_from_dict(d: object, where: str = "spec") -> ObsSpec | MultiAgentSpec:
    """Inverse of :func:`obs_spec_to_dict`, from data alone (a ValueError naming `where` when malformed)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, found {type(d).__name__}")
    try:
        if d.get("kind") == "multi_agent":
            agents = [str(a) for a in d["agents"]]
            total = sum(space_elements(d["observation_spaces"][a], f"{where}.observation_spaces.{a}") for a in agents)
            space_elements({"type": "Box", "shape": [total]}, f"{where}.observation_spaces (all agents)")
            obs = {a: ObsSpec(space_from_dict(d["observation_spaces"][a], f"{where}.observation_spaces.{a}"))
                   for a in agents}
            actions = {a: ActionSpec.from_dict(d["actions"][a]) for a in agents}
            joint = ObsSpec(spaces.Dict({a: obs[a].space for a in agents}))
            return MultiAgentSpec(tuple(agents), obs, actions, joint)
        if d.get("kind") == "single":
            cl = d.get("channels_last")
            scales = d.get("image_scale")
            if scales is not None and not (isinstance(scales, dict) and all(
                    isinstance(k, str) and v in IMAGE_SCALES for k, v in scales.items())):
                raise ValueError(f"{where}.image_scale: expected an object of image key -> one of "
                                 f"{', '.join(IMAGE_SCALES)}, found {str(scales)[:100]}")
            tops = d.get("image_top")
            if tops is not None and not (isinstance(tops, dict) and all(
                    isinstance(k, str) and isinstance(v, list) and all(isinstance(x, int | float) for x in v)
                    for k, v in tops.items())):
                raise ValueError(f"{where}.image_top: expected an object of image key -> list of numbers, found "
                                 f"{str(tops)[:100]}")
            spec = ObsSpec(space_from_dict(d["observation_space"], f"{where}.observation_space"),
                           None if cl is None else bool(cl))
            if scales:
                unknown = set(scales) - set(spec.image_scales)
                if unknown:
                    raise ValueError(f"{where}.image_scale: {sorted(unknown)} are not image keys of the space")
                spec = spec.with_image_scale(scales, {k: tuple(v) for k, v in (tops or {}).items()})
            return spec
    except (KeyError, TypeError, ConfigError, OverflowError, AssertionError, AttributeError) as err:
        raise ValueError(f"{where}: malformed ({err})") from None
    raise ValueError(f"{where}: unknown kind {d.get('kind')!r} (expected single or multi_agent)")
