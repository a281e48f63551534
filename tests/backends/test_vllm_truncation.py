"""Truncated sampling (top-k, top-p, min-p) through vLLM: the behaviour log-probs are those of the kept set vLLM drew
from, and the margins replay that kept set on the trainer's logits (docs/vllm.md, "Truncated sampling").

Each case is checked against a plain recomputation: a Hugging Face forward of the same weights, ``logits / T``,
vLLM's truncations in vLLM's order (min-p, top-k, top-p), a log-softmax over the kept set. ONE colocated engine and
ONE server for the whole file; the in-process stand-in for a server (``FrozenCopyBackend``) needs no vLLM.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.algorithms.importance import lifted_behaviour, rollout_agreement
from lightning_grpo.algorithms.logprob_kernels import KEPT_SLACK, kept_threshold
from lightning_grpo.backends import BackendSpec, VLLMServerBackend, VLLMServerConfig, build_backend
from lightning_grpo.backends.vllm.truncation import kept_margins
from lightning_grpo.backends.vllm_server.process import ServerError
from lightning_grpo.config import BackendConfig, SamplingConfig
from lightning_grpo.rollout.batch import completion_mask_from_ids
from lightning_grpo.rollout.generation import generate_rollout, tokenize_prompts
from lightning_grpo.rollout.logprobs import completion_logprobs, position_ids_from_mask
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.apart_backend import FrozenCopyBackend
from tests.backends.vllm_helpers import PROMPTS, needs_vllm, tiny_policy

pytestmark = [pytest.mark.timeout(600)]

TEMPERATURE = 0.9
#: Two float32 CPU forwards (vLLM's and Hugging Face's, or Hugging Face's over other batch shapes) put a token's scaled
#: logit above the kept set's smallest by amounts that differ by up to about 5e-6 here: a token this close to the
#: boundary, or within the trainer's slack below it (KEPT_SLACK relative), may replay either way.
BOUNDARY = 1e-5
CASES = {
    "top_k": {"top_k": 20},
    "min_p": {"min_p": 0.05},
    "top_p+top_k": {"top_p": 0.8, "top_k": 20},
    "top_p+top_k+min_p": {"top_p": 0.8, "top_k": 20, "min_p": 0.05},
}


def _settings(case: str, g: int = 4) -> SamplingSettings:
    return SamplingSettings(g, 16, temperature=TEMPERATURE, **CASES[case])


def _base():
    """The tiny model with its (tied) output head doubled: sharper distributions, so that min-p 0.05 also cuts inside
    the top 20 (it keeps about 20 tokens of 100 then, about 80 before)."""
    model = tiny_policy()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return model


def _policy():
    """The tiny policy with an adapter that changes its logits (so the sampled weights are the adapter's)."""
    policy = get_peft_model(_base(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    return policy.eval()


def vllm_kept(z: torch.Tensor, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """``(R, V)`` the tokens vLLM keeps from scaled logits ``z``, in its order: min-p (probability below ``min_p``
    times the largest), top-k (below the k-th largest kept value), top-p (ascending, the tokens whose cumulative
    renormalised probability stays at most ``1 - top_p``, the largest always kept)."""
    keep = torch.ones_like(z, dtype=torch.bool)
    if min_p:
        probs = z.softmax(-1)
        keep &= probs >= min_p * probs.max(-1, keepdim=True).values
    if top_k:
        kth = z.masked_fill(~keep, -torch.inf).sort(-1, descending=True).values[:, top_k - 1 : top_k]
        keep &= z >= kth
    if top_p < 1.0:
        ascending, order = z.masked_fill(~keep, -torch.inf).sort(-1)
        dropped = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        dropped[:, -1] = False
        keep &= ~torch.zeros_like(keep).scatter(-1, order, dropped)
    return keep


def _scaled_logits(policy, prompt_mask: torch.Tensor, sequences: torch.Tensor, g: int) -> torch.Tensor:
    """``(N, T, V)`` ``logits / T`` of a Hugging Face forward at each completion position."""
    p = prompt_mask.shape[1]
    mask = torch.cat([prompt_mask.repeat_interleave(g, 0), torch.ones_like(sequences[:, p:])], 1)
    with torch.no_grad():
        out = policy(input_ids=sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return out.logits[:, p - 1 : -1].float() / TEMPERATURE


def check_against_recomputation(policy, tokenizer, prompt_mask, sampled: Sampled, case: str) -> None:
    """The recorded log-probs are the recomputed kept-set ones (1e-4, real tokens), and the margins replay exactly
    the recomputed kept set; truncation did cut (the log-probs are not the full-vocabulary ones)."""
    p, settings = prompt_mask.shape[1], _settings(case)
    completion = sampled.sequences[:, p:]
    real = completion_mask_from_ids(completion, eos_token_ids(tokenizer))[0].bool()
    z = _scaled_logits(policy, prompt_mask, sampled.sequences, settings.num_generations)[real]  # (n, V)
    token, recorded, margins = completion[real], sampled.logprobs[real], sampled.margins[real]
    keep = vllm_kept(z, **CASES[case])
    expected = z.masked_fill(~keep, -torch.inf).log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
    diff = float((recorded - expected).abs().max())
    print(f"{case}: recorded vs recomputed kept-set log-probs, max |diff| {diff:.1e} over {len(token)} tokens")
    assert diff < 1e-4, case
    full = z.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
    cut = (~keep).any(-1).float().mean()  # positions where truncation left tokens out
    assert float((recorded - full).abs().max()) > 1e-3 and cut > 0.5, (case, float(cut))
    for name in CASES[case] if len(CASES[case]) > 1 else []:  # each setting of a combination cuts somewhere
        others = {other: value for other, value in CASES[case].items() if other != name}
        assert not torch.equal(vllm_kept(z, **others), keep), (case, name)
    target = z.gather(-1, token[:, None])
    replayed = z >= kept_threshold(target, margins[:, None])
    slack = KEPT_SLACK * target.abs().clamp(min=1.0)
    boundary = (z - (target - margins[:, None])).abs() < BOUNDARY + slack  # float32 forwards of other shapes differ
    assert not bool(((replayed != keep) & ~boundary).any()), (case, int((replayed != keep).sum()))
    assert bool((margins >= 0).all() & torch.isfinite(margins).all())  # V = 100: never the whole vocabulary kept


def check_raw_ratio(policy, rollout) -> None:
    """The trainer's forward of the weights that sampled (fused head, kept log mass) against the rollout's behaviour
    log-probs: the raw ratio on the kept set is 1 within 1e-3; against the full-vocabulary log-probs it is the kept
    mass (below 0.99 here: the bias the lift removes)."""
    with torch.no_grad():
        found = completion_logprobs(policy, rollout, temperature=TEMPERATURE)
    mask = rollout.completion_mask
    lifted = lifted_behaviour(rollout.logprobs, found.kept_log_mass)
    ratio = float(rollout_agreement(found.logprobs, lifted, mask)["rollout_ratio_raw_mean"])
    full = float(rollout_agreement(found.logprobs, rollout.logprobs, mask)["rollout_ratio_raw_mean"])
    print(f"raw ratio mean: {ratio:.6f} on the kept set, {full:.4f} against full-vocabulary log-probs")
    assert abs(ratio - 1) < 1e-3 and full < 0.99


# ---------------------------------------------------------------------------------------------- the colocated engine


@pytest.fixture(scope="module")
def engine():
    """One colocated engine for the file, built from the tiny base, the adapter synced."""
    from lightning_grpo.backends.vllm.engine import VLLMEngine
    from lightning_grpo.backends.vllm.settings import VLLMConfig

    policy = _policy()
    engine = VLLMEngine.start(policy, VLLMConfig(), model_name=None, max_model_len=64, max_lora_rank=8, seed=0)
    engine.sync(policy, 0)
    yield policy, engine
    engine.close()


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_engine_records_the_kept_set_log_probs_and_margins(engine, case):
    policy, engine = engine
    tokenizer = build_tiny_tokenizer()
    ids, mask = tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    torch.manual_seed(0)
    sampled = engine.sample(policy, tokenizer, SampleRequest(ids, mask, _settings(case)))
    check_against_recomputation(policy, tokenizer, mask, sampled, case)
    torch.manual_seed(0)  # and the rollout carries them, 0 past each completion's end
    rollout = generate_rollout(policy, tokenizer, PROMPTS, _settings(case), max_prompt_length=16, sample=engine.sample)
    assert rollout.kept_margins is not None
    assert torch.equal(rollout.kept_margins, sampled.margins * rollout.completion_mask)
    check_raw_ratio(policy, rollout)


@needs_vllm
@pytest.mark.slow
def test_the_engine_records_no_margins_untruncated_and_refuses_top_p_alone(engine):
    policy, engine = engine
    tokenizer = build_tiny_tokenizer()
    ids, mask = tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    sampled = engine.sample(policy, tokenizer, SampleRequest(ids, mask, SamplingSettings(2, 4, temperature=0.9)))
    assert sampled.margins is None and sampled.logprobs.shape == (8, 4)
    with pytest.raises(SettingError, match=r"top_p=0\.8 with top_k=0: rollout_backend='vllm' cannot record"):
        engine.sample(policy, tokenizer, SampleRequest(ids, mask, SamplingSettings(2, 4, top_p=0.8)))


# ---------------------------------------------------------------------------------------------- refusals and guards


def _spec(backend: str, **sampling) -> BackendSpec:
    args = {"url": "http://127.0.0.1:1"} if backend == "vllm_server" else {}
    grpo = GRPOConfig(
        sampling=SamplingConfig(max_prompt_length=16, max_new_tokens=8, **sampling),
        backend=BackendConfig(rollout_backend=backend, rollout_backend_args=args),
    )
    return BackendSpec(grpo, PolicyConfig(lora_r=4), "my/model")


@pytest.mark.parametrize("backend", ["vllm", "vllm_server"])
def test_top_p_without_top_k_is_refused_when_the_backend_is_built(backend):
    """One line: the settings, why, and the fix; top-p with a top-k and min-p are honoured (no vLLM needed)."""
    with pytest.raises(SettingError) as refused:
        build_backend(_spec(backend, top_p=0.8))
    message = str(refused.value)
    assert message.startswith(f"GRPOConfig.sampling.top_p=0.8 with top_k=0: rollout_backend='{backend}' cannot")
    assert "top-p alone may keep any number of tokens" in message and "\n" not in message
    assert "set GRPOConfig.sampling.top_k (e.g. 50)" in message and "rollout_backend='hf'" in message
    if backend == "vllm_server":  # the colocated one needs vLLM installed to be built
        built = build_backend(_spec(backend, top_p=0.8, top_k=50, min_p=0.05))
        assert built.max_logprobs == 50  # its server started with --max-logprobs 50


def test_a_backend_that_does_not_list_min_p_refuses_it():
    from lightning_grpo.backends.build import check_supported

    class NoMinP:
        supported_settings = frozenset({"top_p", "top_k"})

    with pytest.raises(SettingError, match=r"^GRPOConfig\.sampling\.min_p=0\.05: the rollout backend 'mine' does not"):
        check_supported(NoMinP, _spec("hf", min_p=0.05), "mine")


def test_margins_are_never_recorded_for_a_kept_set_larger_than_the_log_probs_show():
    settings = SamplingSettings(1, 1, top_k=3)
    top = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -3.0, -torch.inf]])
    assert kept_margins(torch.tensor([-1.0, -3.0]), top, settings).tolist() == [1.0, 0.0]
    with pytest.raises(RuntimeError, match="kept more tokens than the 3 log-probs"):
        kept_margins(torch.tensor([-2.5, -0.1]), top, settings)  # sampled below three kept ones: a fourth kept
    with pytest.raises(RuntimeError, match="outside its own kept set"):
        kept_margins(torch.tensor([-torch.inf, -0.1]), top, settings)
    whole = kept_margins(torch.tensor([-1.0]), top[:1], settings, vocab_size=3)  # all three of three kept
    assert whole.tolist() == [torch.inf]
    min_p = kept_margins(torch.tensor([-1.0]), torch.tensor([[-0.5]]), SamplingSettings(1, 1, min_p=0.1))
    assert torch.allclose(min_p, torch.tensor([-1.0 + 0.5 - torch.log(torch.tensor(0.1))]))


# ------------------------------------------------------------------------------------------ the stand-in for a server


@pytest.mark.parametrize("case", list(CASES))
def test_the_frozen_copy_backend_samples_from_the_kept_set_as_vllm_does(case):
    policy, tokenizer = _policy(), build_tiny_tokenizer()
    backend = FrozenCopyBackend(None, None)
    backend.sync(policy, 0)
    ids, mask = tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    torch.manual_seed(0)
    session = backend.session(policy, _settings(case))
    sampled = session.sample(None, tokenizer, SampleRequest(ids, mask, _settings(case)))
    check_against_recomputation(policy, tokenizer, mask, sampled, case)


# ---------------------------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the file (``start: true``, one OpenMP thread), the adapter of :func:`_policy` loaded."""
    folder = tmp_path_factory.mktemp("vllm-truncation-model")
    model = _base()
    model.config.architectures = ["Qwen2ForCausalLM"]
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    config = VLLMServerConfig(start=True, cpu_threads=1, max_lora_rank=8, max_model_len=64)
    spec = BackendSpec(
        GRPOConfig(sampling=SamplingConfig(max_prompt_length=32, max_new_tokens=16, top_k=20)), PolicyConfig(lora_r=4),
        str(folder),
    )  # fmt: skip
    backend, policy = VLLMServerBackend(config, spec), _policy()
    backend.start(policy, seed=0, sharded=False)
    backend.sync(policy, 0)
    yield policy, backend
    backend.close()


@needs_vllm
@pytest.mark.slow
def test_the_server_records_the_kept_set_log_probs_and_margins(server):
    policy, backend = server
    tokenizer = build_tiny_tokenizer()
    ids, mask = tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    for case in ("top_p+top_k+min_p", "min_p"):
        session = backend.session(policy, _settings(case))
        sampled = session.sample(None, tokenizer, SampleRequest(ids, mask, _settings(case)))
        check_against_recomputation(policy, tokenizer, mask, sampled, case)
        rollout = generate_rollout(
            policy, tokenizer, PROMPTS, _settings(case), max_prompt_length=16, sample=session.sample
        )
        session.close()
        check_raw_ratio(policy, rollout)
    session = backend.session(policy, _settings("top_k"))
    with pytest.raises(ServerError, match=r"max allowed: 20 .*\(the backend asks for the top 50 .*--max-logprobs 50"):
        session.sample(None, tokenizer, SampleRequest(ids, mask, SamplingSettings(2, 4, top_k=50)))
    session.close()
