"""Loopback ports for the servers and process groups this project starts itself."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, drawn at random from below the kernel's ephemeral range.

    Outgoing connections take their local port from the ephemeral range, so a port the kernel hands
    out from that range (``bind(0)``) can be taken by any client between this check and the server's
    own bind; CI saw exactly that (MLflow failed with EADDRINUSE). Ports are drawn with ``secrets``, not
    ``random``, so a seeded test cannot make two processes draw the same sequence, and a port is handed
    out once per process."""
    low, _ = _ephemeral_range()
    floor = 20000 if low > 21000 else 1024
    for _ in range(256):
        port = floor + secrets.randbelow(max(low - floor, 1))
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # a crowded range below: let the kernel choose
        s.bind((host, 0))
        return s.getsockname()[1]
