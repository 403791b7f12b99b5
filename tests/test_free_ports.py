"""Ports handed to a child process come from outside the ephemeral range and bind now.

A three-node CI test once died because a node's port, picked by bind(0), went to a client
socket before the node bound it (app/free_ports.py).
"""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

import app.free_ports as free_ports_module
from app.free_ports import MIN_SPAN, PORT_FLOOR, candidate_span, ephemeral_range, free_ports

pytestmark = pytest.mark.timeout(30)


def test_the_span_lies_below_the_ephemeral_range_or_above_it_when_that_starts_low():
    assert candidate_span((32768, 60999)) == range(PORT_FLOOR, 32768)
    assert candidate_span((PORT_FLOOR + 100, 40000)) == range(40001, 65536)
    wide = candidate_span((PORT_FLOOR + 100, 65535 - MIN_SPAN + 1))
    assert wide == range(PORT_FLOOR, 65536)  # no room either side: the whole range, bind-checked


def test_an_unreadable_range_file_falls_back_to_linux_defaults(tmp_path: Path):
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
    garbled = tmp_path / "range"
    garbled.write_text("not numbers\n")
    assert ephemeral_range(garbled) == (32768, 60999)
    garbled.write_text("20000\t50000\n")
    assert ephemeral_range(garbled) == (20000, 50000)


def test_picked_ports_are_distinct_free_and_never_ephemeral():
    low, high = ephemeral_range()
    ports = free_ports(6) + free_ports(6)
    assert len(set(ports)) == 12
    assert not any(low <= p <= high for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_someone_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(free_ports_module, "_next_index", itertools.count())  # walk from the start
    first = free_ports(1, slot=3)[0]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen()
        monkeypatch.setattr(free_ports_module, "_next_index", itertools.count())  # the same walk again
        again = free_ports(1, slot=3)[0]
    assert again != first
    assert again in candidate_span(ephemeral_range())
