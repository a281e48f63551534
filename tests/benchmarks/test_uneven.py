"""The uneven-lengths workload (issue 55): the length draw, the padding share, the bound, and the EOS hook that forces
the scripted lengths on a tiny model through ``generate`` (as TRL samples) and through our sampling paths."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bounds import forward_flops, phase_bounds
from benchmarks.models import prepare_model
from benchmarks.run import UNEVEN, parse_args, parse_variant
from benchmarks.uneven import ScriptedEOS, check_lengths, draw_lengths, length_summary, padding_share
from benchmarks.workload import Workload
from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings


def test_draw_is_seeded_clipped_long_tailed_and_reaches_the_cap():
    lengths = draw_lengths(64, 8, 512, 64.0, 1.0, seed=0)
    assert lengths == draw_lengths(64, 8, 512, 64.0, 1.0, seed=0) != draw_lengths(64, 8, 512, 64.0, 1.0, seed=1)
    assert min(lengths) >= 8 and max(lengths) == 512 and lengths.count(512) >= 1
    assert sorted(lengths)[32] < sum(lengths) / 64  # long tail: the median lies below the mean
    with pytest.raises(ValueError, match="low <= high"):
        draw_lengths(4, 9, 8, 64.0, 1.0, seed=0)


def test_padding_share_against_the_longest_row_and_the_summary():
    assert padding_share([2, 4, 8, 2]) == pytest.approx(1 - 16 / 32)
    assert padding_share([4, 4], width=8) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shorter than the longest"):
        padding_share([4, 9], width=8)
    summary = length_summary([8, 9, 20, 100, 512])
    assert summary["histogram"] == {"<=8": 1, "<=16": 1, "<=32": 1, "<=64": 0, "<=128": 1, "<=256": 0, "<=512": 1}
    assert (summary["p50"], summary["max"], summary["tokens"]) == (20, 512, 649)


def test_the_uneven_preset_has_at_least_half_padding_and_refuses_fixed_lengths():
    work = Workload.from_args(parse_args(["--workload", "uneven"]))
    work.check()
    assert work.rows == UNEVEN["prompts"] * UNEVEN["num_generations"] == 64
    assert padding_share(work.scripted_lengths()) >= 0.5
    assert Workload.from_args(parse_args(["--workload", "uneven", "--prompts", "2"])).prompts == 2  # flags win
    with pytest.raises(ValueError, match="no-fixed-length"):
        Workload(length_dist="lognormal").check()
    name, padded = parse_variant("padded:update.packing=false,update.micro_batch_tokens=700,threads=4", work)
    assert (name, padded.packing, padded.micro_batch_tokens, padded.kl_coef) == ("padded", "false", 700, 0.04)
    assert padded.threads == 4  # a workload field that is no setting: by its own name
    with pytest.raises(ValueError, match="FIELD one of"):
        parse_variant("x:nonsense=1", work)
    with pytest.raises(ValueError, match=r"packing moved to update\.packing"):  # a setting by its group only
        parse_variant("x:packing=false", work)
    with pytest.raises(ValueError, match="anything but"):
        parse_variant("trl:update.packing=false", work)


def test_check_lengths_compares_every_rollout_as_a_multiset():
    check_lengths("ours", [[3, 5, 4], [5, 4, 3]], [4, 3, 5])
    with pytest.raises(RuntimeError, match="rollout 1"):
        check_lengths("trl", [[3, 5, 4], [5, 5, 3]], [4, 3, 5])
    with pytest.raises(RuntimeError, match="no completion lengths"):
        check_lengths("trl", [], [4])


def test_forward_flops_count_real_tokens_and_attention():
    from benchmarks.models import ParamCounts

    counts = ParamCounts(body=10, head=3, embedding=3, total=13, layers=2, kv_heads=1, head_dim=4, attention_dim=4)
    # one prompt of 2 tokens (attending 1 + 2), one completion of 2 tokens (attending 3 + 4)
    assert forward_flops(counts, 1, 2, [2]) == 2 * 10 * 4 + 2 * 3 * 2 + 4 * 2 * 4 * (3 + 7)
    bounds = phase_bounds(counts, 1, 2, [2], peak_flops=1.0, ppo_epochs=2)
    assert bounds["update"] == 4 * bounds["reference"] and bounds["score"] == 0.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from benchmarks.models import load_tokenizer
    from lightning_grpo.policy import PolicyConfig, load_policy

    directory = prepare_model("tiny", tmp_path_factory.mktemp("tiny"))
    tokenizer = load_tokenizer(directory)
    return load_policy(str(directory), PolicyConfig(lora_r=4, dtype="float32")).eval(), tokenizer


def _completion_lengths(sequences: torch.Tensor, prompt_length: int, eos: int) -> list[int]:
    completion = sequences[:, prompt_length:]
    is_eos = completion == eos
    return [int(row.nonzero()[0]) + 1 if row.any() else len(row) for row in is_eos]


@pytest.mark.parametrize(
    "options",
    [
        {"share_prompt": False},  # generate on every row, as TRL samples
        {"share_prompt": True},  # a shared prefix forward (t < 0), then generate from its cache
        {"drop_finished": True},  # our own loop: finished rows leave the batch
    ],
)
def test_the_hook_forces_the_scripted_lengths(tiny, options):
    model, tokenizer = tiny
    prompt_length, g, lengths = 5, 3, [2, 9, 4, 12, 3, 7]
    prompt_ids = torch.randint(10, 40, (2, prompt_length), generator=torch.Generator().manual_seed(0))
    settings = SamplingSettings(num_generations=g, max_new_tokens=12, **options)
    scripted = ScriptedEOS(lengths, prompt_length, tokenizer.eos_token_id).attach(model)
    try:
        request = SampleRequest(prompt_ids, torch.ones_like(prompt_ids), settings)
        with torch.no_grad(), scripted.sampling():
            sequences = sample_tokens(model, tokenizer, request).sequences
        with torch.no_grad():  # outside sampling the model is left alone
            plain = model(input_ids=prompt_ids).logits
    finally:
        scripted.detach()
    assert _completion_lengths(sequences, prompt_length, tokenizer.eos_token_id) == lengths
    assert scripted.forced == len(lengths) and torch.isfinite(plain).all()


def test_the_hook_refuses_a_batch_it_cannot_map(tiny):
    model, tokenizer = tiny
    scripted = ScriptedEOS([3, 3, 3, 3], 2, tokenizer.eos_token_id).attach(model)
    try:
        with torch.no_grad(), scripted.sampling(), pytest.raises(RuntimeError, match="cannot be assigned"):
            model(input_ids=torch.full((3, 4), 12))  # 3 rows deciding token 2, where rows may end
    finally:
        scripted.detach()


def test_side_bounds_skip_phases_that_did_not_run_and_sum_the_rest():
    from benchmarks.bounds import side_bounds

    side = {"step_seconds": 10.0, "phase_seconds": {"generate": 4.0, "score": 0.5, "old_logprobs": 0.0,
                                                   "reference": 1.0, "update": 4.0}}  # fmt: skip
    bounds = {"generate": 1.0, "score": 0.0, "old_logprobs": 0.5, "reference": 0.5, "update": 1.0, "step": 3.0}
    rows = side_bounds(side, bounds)
    assert set(rows) == {"generate", "reference", "update", "step"}
    assert rows["step"]["bound_seconds"] == 2.5 and rows["update"]["fraction"] == 0.25


def test_trl_reward_records_each_rollouts_completion_lengths():
    pytest.importorskip("trl")
    from benchmarks.trl_side import _LengthRecorder

    reward = _LengthRecorder()
    scores = reward(["p", "p"], ["77", "a7"], completion_ids=[[5, 6, 1], [5, 1]], trainer_state=None)
    assert scores == [1.0, 0.5] and reward.rollouts == [[3, 2]] and reward.__name__ == "fraction_of_sevens"
