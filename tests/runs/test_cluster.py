"""Cluster addresses, checked before Ray is asked (no cluster needed): `split_address` reads
HOST:PORT and ray://HOST:PORT or names the form, and `check_reachable` fails at once, in one line,
where nothing answers."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from treesearch.common.errors import DistributedError
from treesearch.runs.cluster import check_reachable, split_address


@pytest.mark.parametrize(
    "address,want",
    [
        ("host:6379", ("host", 6379)),
        ("ray://10.0.0.1:10001", ("10.0.0.1", 10001)),  # Ray Client's form
        ("[::1]:6379", ("::1", 6379)),  # an IPv6 host in brackets
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    ],
)
def test_host_and_port_are_read(address, want):
    assert split_address(address) == want


@pytest.mark.parametrize(
    "address", ["nowhere", ":6379", "host:", "host:0", "host:65536", "host:port", "ray://"]
)
def test_an_address_without_host_and_port_names_the_form(address):
    with pytest.raises(DistributedError) as info:
        split_address(address)
    assert str(info.value) == (
        f"--ray-address {address}: write HOST:PORT, the port the head was started on "
        "(`ray start --head` prints it; 6379 by default), or auto for a cluster on this machine"
    )


def test_auto_is_not_checked_and_a_port_that_answers_passes():
    check_reachable("auto")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")


def test_a_port_where_nothing_answers_fails_at_once_naming_the_fix():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DistributedError) as info:
        check_reachable(f"127.0.0.1:{port}")
    msg = str(info.value)
    assert msg.startswith(
        f"--ray-address 127.0.0.1:{port}: nothing answers there (connection refused within 3 s)"
    )
    assert f"`ray start --head --port={port}`" in msg and "\n" not in msg


def test_importing_the_module_does_not_import_ray():
    """`require_ray` is the one place that imports Ray (a fresh interpreter, since this one may
    hold it from another test)."""
    code = "import sys, treesearch.runs.cluster; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
