"""Starting or joining the Ray cluster a distributed run uses (`treesearch.runs.distributed`).

    connect()                      # a local cluster on this machine (num_cpus as asked), shut down at close
    connect("auto")                # the cluster `ray start --head` started on this machine
    connect("10.0.0.5:6379")       # a cluster's head (its GCS port)

Ray is optional: nothing here imports it before `require_ray()`, and a missing Ray is a
DistributedError that names the install command. An address that does not answer fails at once,
in one line: a TCP check with a short timeout runs before `ray.init`, which would otherwise retry
for a minute or more. A Ray already initialised in this process (`ray.init` in the caller's own
code, or a test's cluster) is used as it is and left running.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

from treesearch.common.errors import DistributedError

INSTALL = "pip install -e '.[ray]' (in a checkout of treesearch; elsewhere: pip install 'ray>=2.40,<3')"
CONNECT_TIMEOUT_S = 3.0
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # results are small; the default (30% of RAM) is not needed


def require_ray() -> Any:
    """The ray module, or a DistributedError naming the command that installs it."""
    try:
        import ray
    except ImportError as err:
        raise DistributedError(
            f"Ray is not installed, and running over workers needs it; install it with: {INSTALL}"
        ) from err
    return ray


@dataclass
class Cluster:
    """A connection to a Ray cluster: where it is, whether this process started it (then `close`
    shuts it down), and how long starting or joining took."""

    address: str
    started: bool
    startup_s: float

    def close(self) -> None:
        """Shut down a cluster this process started; leave a joined one running."""
        if self.started:
            require_ray().shutdown()
            self.started = False


def connect(address: str | None = None, *, num_cpus: int | None = None) -> Cluster:
    """Start a local Ray cluster (address None; `num_cpus` logical CPUs) or join the one at
    `address` ("auto" or HOST:PORT, also ray://HOST:PORT). Raises DistributedError in one line."""
    ray = require_ray()
    t0 = time.perf_counter()
    if ray.is_initialized():
        return Cluster(address=_current_address(ray), started=False, startup_s=0.0)
    quiet = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    if address is None:
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                **quiet,
            )  # a cluster of this machine only: loopback
        except Exception as exc:  # ray's own start-up errors (ports, /tmp, memory): one line
            raise DistributedError(f"could not start a local Ray cluster: {_one_line(exc)}") from None
        return Cluster(address=_current_address(ray), started=True, startup_s=time.perf_counter() - t0)
    check_reachable(address)
    try:
        ray.init(address=address, **quiet)
    except Exception as exc:  # ConnectionError (no cluster for "auto"), version mismatch, ...
        raise DistributedError(
            f"--ray-address {address}: could not join the Ray cluster there: {_one_line(exc)}; "
            "start one with `ray start --head` or leave --ray-address out for a local one"
        ) from None
    return Cluster(address=_current_address(ray), started=False, startup_s=time.perf_counter() - t0)


def check_reachable(address: str) -> None:
    """HOST:PORT (or ray://HOST:PORT) answers a TCP connection within CONNECT_TIMEOUT_S ("auto":
    nothing to check; ray.init itself fails at once when no cluster runs here)."""
    if address == "auto":
        return
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise DistributedError(
            f"--ray-address {address}: nothing answers there ({why} within "
            f"{CONNECT_TIMEOUT_S:g} s); start the head there with `ray start --head --port={port}`, "
            "check the host and port, or leave --ray-address out for a local cluster"
        ) from None


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT or ray://HOST:PORT; DistributedError naming the form otherwise."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(
            f"--ray-address {address}: write HOST:PORT, the port the head was started on "
            "(`ray start --head` prints it; 6379 by default), or auto for a cluster on this machine"
        )
    return host.strip("[]"), int(port)


def _current_address(ray: Any) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an older or client-mode Ray without it
        return "?"


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (" ".join(lines) or type(exc).__name__)[:300]
