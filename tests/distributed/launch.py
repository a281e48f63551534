"""Start N worker processes as torchrun would, wait with a deadline, and leave none behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import repo_pythonpath

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "NODE_RANK": "0",
        "LOCAL_RANK": str(rank),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": repo_pythonpath(),
    }


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def run_ranks(
    args: list[str],
    workdir: Path,
    *,
    world_size: int = 2,
    timeout: float = 150.0,
    worker: str = "tests.distributed.worker",
) -> float:
    """Run ``python -m <worker> *args`` on ``world_size`` ranks; fail on an error or a hang.

    Each rank runs in its own session so that, on failure or timeout, every process it started is killed.

    Returns:
        The wall time in seconds.

    Raises:
        AssertionError: A rank failed, or the ranks did not finish within ``timeout`` seconds (a hang); the message
            holds the end of every rank's log.
    """
    start = time.monotonic()
    logs = [workdir / f"rank{rank}.log" for rank in range(world_size)]
    procs = _spawn([sys.executable, "-m", worker, *args], logs)
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() - start < timeout:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one rank failed: the others would wait for it forever
            time.sleep(0.2)
    finally:
        running = [rank for rank, p in enumerate(procs) if p.poll() is None]
        left_behind = [rank for rank, p in enumerate(procs) if _stop_session(p)]
    codes = [p.returncode for p in procs]
    failed = [rank for rank, code in enumerate(codes) if rank not in running and code != 0]
    stray = [rank for rank in left_behind if rank not in running]
    hung = f"still running after {timeout:.0f} s (a hang?)" if not failed else "killed after the failure"
    problems = [
        *([f"ranks {running} {hung}"] if running else []),
        *([f"ranks {failed} failed (exit codes {codes})"] if failed else []),
        *([f"ranks {stray} left processes behind"] if stray else []),
    ]
    if problems:
        details = "\n".join(f"--- rank {rank} log ---\n{_tail(log)}" for rank, log in enumerate(logs))
        raise AssertionError(f"distributed run {args}: {'; '.join(problems)}\n{details}")
    return time.monotonic() - start


def _spawn(command: list[str], logs: list[Path]) -> list[subprocess.Popen]:
    """One process per log file (its rank), each in a session of its own so that it can be killed whole."""
    port, procs = free_port(), []
    for rank, log in enumerate(logs):
        with log.open("w") as out:
            env = _env(rank, len(logs), port)
            proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            procs.append(proc)
    return procs


def _stop_session(proc: subprocess.Popen, grace: float = 3.0) -> bool:
    """Kill what is left of the session ``proc`` leads and reap ``proc``; whether anything was left.

    A finished rank's helpers that end on their own as it exits (Python's ``multiprocessing`` resource tracker reads
    its pipe until the rank closes it) get ``grace`` seconds; whatever is still there after that was left behind.
    """
    deadline = time.monotonic() + (grace if proc.poll() is not None else 0.0)
    while True:
        try:
            os.killpg(proc.pid, 0)  # raises when no process of the session remains
        except ProcessLookupError:
            proc.wait()
            return False
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True
