"""Worker processes of a multi-worker run, for the training command: how long a worker waits for
its peers, which peers are unreachable, and the local launcher that starts one training command
per worker over loopback (``launch_local_workers``). The strategy itself and ``TF_CONFIG``'s
validation are the library's (``vcd_helpers.distributed``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from vcd_helpers.config import check_positive_int

WORKER_TIMEOUT_ENV = "VCD_WORKER_TIMEOUT"
DEFAULT_WORKER_TIMEOUT = 300.0
# Workers started together on one machine (launch_local_workers) join within seconds: a peer that
# failed to start is reported after a minute, not five.
LOCAL_WORKER_TIMEOUT = 60.0


def worker_timeout() -> float:
    """Seconds a worker waits for the others to join: ``$VCD_WORKER_TIMEOUT``, default 300."""
    raw = os.environ.get(WORKER_TIMEOUT_ENV, str(DEFAULT_WORKER_TIMEOUT))
    try:
        timeout = float(raw)
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ValueError(f"${WORKER_TIMEOUT_ENV}={raw!r} is invalid: must be a positive number of seconds")
    return timeout


def unreachable(addresses: list[str]) -> list[str]:
    """The 'host:port' addresses that refuse a TCP connection now."""
    out = []
    for address in addresses:
        host, port = address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except (OSError, ValueError):
            out.append(address)
    return out


def free_local_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 now (the OS picks them)."""
    check_positive_int("count", count)
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch_local_workers(config_file: str | os.PathLike, results_dirs: list[Path], *,
                         env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start the training command once per results directory, as the workers of one
    MultiWorkerMirroredStrategy cluster over loopback: worker k gets a TF_CONFIG naming every
    worker's 127.0.0.1 address and its own index. Returns the processes (stdout and stderr merged,
    as text); wait for them with ``communicate``. ``env``: the environment (default: this one);
    unless it sets ``$VCD_WORKER_TIMEOUT``, a worker waits ``LOCAL_WORKER_TIMEOUT`` seconds for the
    others."""
    addresses = [f"127.0.0.1:{port}" for port in free_local_ports(len(results_dirs))]
    processes = []
    for task, results in enumerate(results_dirs):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": task}}
        command = [sys.executable, "-m", "vcd_helpers", "train", "--config", str(config_file), "--results",
                   str(results), "--strategy", "multi_worker", "--quiet"]
        worker_env = {WORKER_TIMEOUT_ENV: str(LOCAL_WORKER_TIMEOUT)} | (env or dict(os.environ))
        processes.append(subprocess.Popen(command, env=worker_env | {"TF_CONFIG": json.dumps(tf_config)},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return processes
