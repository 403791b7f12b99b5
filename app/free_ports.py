"""Free TCP ports to hand to a process that will bind them a moment later.

Why not `bind(0)`: the kernel answers from the ephemeral range, the same range every outgoing
connection on the machine draws its local port from. Between our close and the child's bind,
any client socket (a mesh heartbeat, an HTTP fetch) may take the port, and the child dies with
"address already in use". A CI run lost a three-node test that way. Ports below the ephemeral
range are never handed to client sockets, so picking there (and checking each one binds now)
leaves only another picker to race with; each process walks its own stretch of the range.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, where the file cannot be read
PORT_FLOOR = 10000  # below: the well-known and registered services a machine is likely to run
MIN_SPAN = 2000  # fewer free ports than this below the ephemeral range: use the ones above it
SLOT_STRIDE = 4112  # ports between two slots' starting points: each walks thousands before meeting the next

_next_index = itertools.count()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def candidate_span(ephemeral: tuple[int, int]) -> range:
    """The ports outside the ephemeral range a picker walks: below it, or above it if it starts low."""
    low, high = ephemeral
    if low - PORT_FLOOR >= MIN_SPAN:
        return range(PORT_FLOOR, low)
    if 65535 - high >= MIN_SPAN:
        return range(high + 1, 65536)
    return range(PORT_FLOOR, 65536)  # the ephemeral range covers nearly everything: no better choice


def _binds_now(port: int, host: str) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind((host, port))
        return sock
    except OSError:
        sock.close()
        return None


def free_ports(n: int, host: str = "127.0.0.1", slot: int | None = None) -> list[int]:
    """`n` distinct ports that bind on `host` now, from outside the ephemeral range.

    `slot` picks this caller's stretch of the span (a test worker's index); by default the
    process id does, so two processes picking at once start far apart.
    """
    span = candidate_span(ephemeral_range())
    start = ((os.getpid() if slot is None else slot) * SLOT_STRIDE) % len(span)
    held: list[socket.socket] = []
    try:
        for _ in range(len(span)):
            port = span[(start + next(_next_index)) % len(span)]
            sock = _binds_now(port, host)
            if sock is not None:
                held.append(sock)
                if len(held) == n:
                    return [s.getsockname()[1] for s in held]
        raise OSError(f"no {n} free ports on {host} in {span.start}-{span.stop - 1}")
    finally:
        for s in held:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
