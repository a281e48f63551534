"""Sampling: masks after EOS, truncation flags, eval mode, seeding, and log-probs equal to the sampling distribution."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.rollout import SamplingSettings, completion_logprobs, generate_rollout
from lightning_grpo.testing import build_tiny_model


def _rollout(model, tokenizer, **settings):
    options = {"num_generations": 3, "max_new_tokens": 10, "temperature": 0.9}
    return generate_rollout(
        model,
        tokenizer,
        ["1+2=", "33+4="],
        SamplingSettings(**{**options, **settings}),
        max_prompt_length=8,
        columns={"answer": ["3", "37"]},
    )


def test_rollout_shapes_masks_and_columns(tokenizer):
    model = build_tiny_model(tokenizer)
    torch.manual_seed(0)
    rollout = _rollout(model, tokenizer)
    assert len(rollout) == 6 and rollout.completion_ids.shape == (6, 10)
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert rollout.prompts == ["1+2="] * 3 + ["33+4="] * 3
    assert rollout.columns == {"answer": ["3"] * 3 + ["37"] * 3}
    eos = tokenizer.eos_token_id
    for ids, mask, truncated in zip(rollout.completion_ids, rollout.completion_mask, rollout.truncated, strict=True):
        valid = int(mask.sum())
        # valid tokens form a prefix; the last valid one is the first EOS unless the sample was truncated
        assert mask[:valid].all() and not mask[valid:].any()
        assert bool(truncated) == (eos not in ids[:valid].tolist())
        if not truncated:
            assert ids[valid - 1] == eos and eos not in ids[: valid - 1].tolist()
    assert (rollout.completion_ids[rollout.completion_mask == 0] == tokenizer.pad_token_id).all()


def test_sampling_is_seeded_and_in_eval_mode(tokenizer):
    model = build_tiny_model(tokenizer).train()
    modes = []
    model.model.layers[0].register_forward_hook(lambda module, args, out: modes.append(module.training))
    torch.manual_seed(3)
    first = _rollout(model, tokenizer)
    torch.manual_seed(3)
    second = _rollout(model, tokenizer)
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert modes and not any(modes), "generation must run in eval mode (dropout and checkpointing off)"
    assert model.training, "the model's mode is restored after sampling"


def test_training_logprobs_match_the_sampling_distribution(tokenizer):
    """The update pass scores tokens with the distribution they were sampled from: softmax(logits / temperature)."""
    model = build_tiny_model(tokenizer).eval()
    settings = SamplingSettings(num_generations=3, max_new_tokens=10, temperature=0.7)
    prompts = ["1+2=", "33+4="]
    torch.manual_seed(0)
    rollout = generate_rollout(model, tokenizer, prompts, settings, max_prompt_length=8)
    torch.manual_seed(0)  # same draw again, now keeping the processed scores of every decoding step
    encoded = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    out = model.generate(
        **encoded,
        generation_config=settings.generation_config(tokenizer),
        output_scores=True,
        return_dict_in_generate=True,
    )
    scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # (N, T, V) at temperature 0.7
    sampled = scores.gather(-1, rollout.completion_ids[:, : scores.shape[1], None]).squeeze(-1)
    ours = completion_logprobs(model, rollout, temperature=0.7).logprobs[:, : scores.shape[1]]
    mask = rollout.completion_mask[:, : scores.shape[1]].bool()
    torch.testing.assert_close(ours[mask], sampled[mask], atol=1e-4, rtol=1e-4)


def test_prompt_longer_than_limit_is_an_error(tokenizer):
    model = build_tiny_model(tokenizer)
    with pytest.raises(ValueError, match="more than max_prompt_length=3"):
        generate_rollout(model, tokenizer, ["12345"], SamplingSettings(2, 4), max_prompt_length=3)
