"""Rendezvous ports come from below the kernel's ephemeral range, where no outgoing connection is handed one."""
import socket

from dsprune import distributed


def test_a_port_below_the_ephemeral_range_that_binds(tmp_path, monkeypatch):
    (tmp_path / "range").write_text("40000\t60999\n")
    monkeypatch.setattr(distributed, "EPHEMERAL", tmp_path / "range")
    ports = {distributed.free_port() for _ in range(20)}
    assert all(28000 <= p < 40000 for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_without_the_range_file_linux_defaults_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "EPHEMERAL", tmp_path / "missing")
    assert 20768 <= distributed.free_port() < 32768
