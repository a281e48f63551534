"""Talking to a vLLM server over HTTP, and a server this package starts and stops itself (``start: true``).

:func:`post_json` and :func:`get_json` are plain ``urllib`` calls whose failures name the URL and what to do: an
unreachable server, a timeout (retried once, then an error naming ``request_timeout_s``), vLLM's own error message.
:class:`ServerProcess` runs ``vllm serve`` in its own process group, waits until it answers, and kills the group
(the API server and its engine process) on :meth:`~ServerProcess.close`, on an exception and at interpreter exit.
The server runs through :mod:`~lightning_grpo.backends.vllm_server.launch` (the scalar-kernel fix under
``ATEN_CPU_CAPABILITY=default``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ServerError", "ServerProcess", "free_port", "get_json", "post_json", "server_environment"]


class ServerError(RuntimeError):
    """The vLLM server is unreachable, timed out, or refused a request (the message says which and shows vLLM's)."""


def _is_timeout(error: BaseException) -> bool:
    reason = getattr(error, "reason", error)
    return isinstance(reason, TimeoutError | socket.timeout) or "timed out" in str(reason)


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # vLLM answers the LoRA endpoints with plain text ("Success: ...")


def _detail(error: urllib.error.HTTPError) -> str:
    """vLLM's message in an error answer (``{"error": {"message": ...}}``), else the answer's text."""
    detail = error.read().decode(errors="replace")
    with contextlib.suppress(ValueError, KeyError, TypeError):
        detail = str(json.loads(detail)["error"]["message"])
    return detail


def _call(
    url: str,
    body: dict[str, Any] | None,
    timeout: float,
    *,
    what: str,
    hint: str,
    already_done: Callable[[str], bool] | None = None,
) -> Any:
    """One HTTP call, sent a second time if the first timed out.

    The server may have done what the timed-out call asked all the same: ``already_done(message)`` says whether
    vLLM's refusal of the second call means so (e.g. "already loaded"); it is then vLLM's message, returned. A
    refusal of the first call is always an error.

    Raises:
        ServerError: The server answered with an error (vLLM's message), was unreachable, or timed out twice.
    """
    for attempt in (1, 2):
        try:
            return _request(url, body, timeout)
        except urllib.error.HTTPError as error:
            detail = _detail(error)
            if attempt == 2 and already_done is not None and already_done(detail):  # attempt 2: after a timeout
                return detail
            raise ServerError(f"the vLLM server refused {what} ({url}, HTTP {error.code}): {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
            if _is_timeout(error) and attempt == 1:
                continue
            if _is_timeout(error):
                raise ServerError(
                    f"{what} to the vLLM server ({url}) timed out twice after {timeout:g} s "
                    "(GRPOConfig.backend.rollout_backend_args.request_timeout_s): raise request_timeout_s, or check "
                    "that the "
                    "server is not overloaded"
                ) from error
            base = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
            raise ServerError(
                f"the vLLM server at {base} is unreachable during {what} ({url}: {error}); {hint}"
            ) from error
    raise AssertionError("unreachable")  # pragma: no cover


def post_json(
    url: str,
    body: dict[str, Any],
    timeout: float,
    *,
    what: str,
    hint: str = "",
    already_done: Callable[[str], bool] | None = None,
) -> Any:
    """POST ``body`` as JSON to ``url``; the parsed answer (JSON, or text). See :func:`_call` for the errors.

    ``already_done(message)``: whether vLLM's refusal of the resend after a timeout means the first call was done
    (names are unique: "already loaded" on the resend of a load is its success); ``None``: every refusal is an error.
    """
    return _call(url, body, timeout, what=what, hint=hint or "is it still running?", already_done=already_done)


def get_json(url: str, timeout: float, *, what: str, hint: str = "") -> Any:
    """GET ``url``; the parsed answer. See :func:`_call` for the errors."""
    return _call(url, None, timeout, what=what, hint=hint or "is it still running?")


def free_port() -> int:
    """A TCP port nothing listens on right now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_environment(*, cpu_kv_cache_gb: int, cpu_threads: int | None) -> dict[str, str]:
    """The environment of a started server: runtime LoRA loading on; on a CPU build its KV cache (the user's
    ``VLLM_CPU_KVCACHE_SPACE`` wins) and, with ``cpu_threads``, its OpenMP threads unbound and limited;
    ``ATEN_CPU_CAPABILITY`` passes through (the launcher applies the scalar-kernel fix under ``default``)."""
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gb))
    if cpu_threads is not None:
        env.update(OMP_NUM_THREADS=str(cpu_threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the colocated engine's in-process setting: not for a server
    return env


class ServerProcess:
    """``vllm serve`` run by this package: started in its own process group, stopped with all its processes.

    Args:
        args: The arguments after ``vllm serve`` (see :func:`~lightning_grpo.backends.vllm_server.settings.
            serve_command`).
        env: Its environment (see :func:`server_environment`).
        command: The program and its first arguments; default this module as the launcher.
    """

    def __init__(self, args: list[str], env: dict[str, str], command: list[str] | None = None) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="lightning-grpo-vllm-server-", suffix=".log")[1])
        launcher = command or [sys.executable, "-m", "lightning_grpo.backends.vllm_server.launch"]
        with self.log_path.open("wb") as log:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [*launcher, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.process.pid
        atexit.register(self.close)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` of the server's output."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, url: str, timeout: float) -> None:
        """Wait until ``url/health`` answers.

        Raises:
            ServerError: The server exited, or did not answer within ``timeout`` seconds (it is stopped then); the
                message holds the end of its output.
        """
        print(
            f"vLLM server: starting `vllm serve` (it loads the model and warms up: usually 30 s to a few minutes, at "
            f"most start_timeout_s={timeout:g} s); its output goes to {self.log_path}",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code, tail = None if self.process is None else self.process.returncode, self.log_tail()
                self.close()
                raise ServerError(f"the vLLM server this run started exited (code {code}):\n{tail}")
            try:
                _request(f"{url}/health", None, timeout=5)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        tail = self.log_tail()
        self.close()
        raise ServerError(
            f"the vLLM server this run started did not answer at {url} within {timeout:g} s "
            f"(GRPOConfig.backend.rollout_backend_args.start_timeout_s):\n{tail}"
        )

    def close(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 20 s) and remove its log; safe to call twice."""
        process, self.process = self.process, None
        atexit.unregister(self.close)
        if process is not None:
            _stop_group(process)
        self.log_path.unlink(missing_ok=True)


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group ``process`` leads, SIGKILL to what is left after 20 s; reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):  # also the engine process, should it outlive the API server
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
