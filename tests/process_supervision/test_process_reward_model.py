"""ProcessRewardModel: tiny random token- and sequence-classification models score each step of a completion."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

from lightning_grpo.rewards import ProcessRewardModel, RewardFunctions, StepRewards, gives_step_rewards
from lightning_grpo.testing import build_tiny_tokenizer, tiny_config


def _model(cls, num_labels: int):
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=1)
    config.num_labels = num_labels
    torch.manual_seed(0)
    return cls(config).eval(), tokenizer


def test_token_classification_reads_each_step_at_its_last_character():
    model, tokenizer = _model(Qwen2ForTokenClassification, 2)
    prm = ProcessRewardModel(model, tokenizer, label=1)
    assert gives_step_rewards(prm)
    prompt, completion = "1+2=", "3\nso 3\nok"
    [steps] = prm([prompt], [completion])
    assert steps.ends == (2, 7, 9)  # "3\n", "so 3\n", "ok"
    # By hand: one forward over prompt + completion (one token per character here), softmax, class 1, read at the
    # token of each step's last character: 4 prompt characters + end - 1.
    ids = tokenizer(prompt + completion, add_special_tokens=False, return_tensors="pt")["input_ids"]
    probabilities = model(input_ids=ids).logits[0].softmax(-1)[:, 1]
    torch.testing.assert_close(torch.tensor(steps.rewards), probabilities[[4 + 2 - 1, 4 + 7 - 1, 4 + 9 - 1]])


def test_sequence_classification_scores_each_prefix():
    model, tokenizer = _model(Qwen2ForSequenceClassification, 1)
    prm = ProcessRewardModel(model, tokenizer, batch_size=2)
    completions = ["ab\ncd\ne", [{"role": "assistant", "content": "x"}], ""]
    prompts = ["q:", [{"role": "user", "content": "p"}], "q:"]
    steps = prm(prompts, completions)
    expected = []
    for prefix in ("q:ab\n", "q:ab\ncd\n", "q:ab\ncd\ne"):
        ids = tokenizer(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
        expected.append(float(model(input_ids=ids).logits[0, 0]))
    assert steps[0].ends == (3, 6, 7)
    torch.testing.assert_close(torch.tensor(steps[0].rewards), torch.tensor(expected))  # batched with padding
    assert steps[1].ends == (1,) and steps[2] is None
    scores = RewardFunctions([prm])(prompts, completions)
    assert scores.steps["process_reward_model"][0] == steps[0]
    assert float(scores.rewards[0]) == pytest.approx(sum(expected), rel=1e-5)  # outcome estimators: the steps' sum


def test_other_models_and_labels_are_refused():
    tokenizer = build_tiny_tokenizer()
    with pytest.raises(ValueError, match=r"ForTokenClassification or \.\.\.ForSequenceClassification"):
        ProcessRewardModel(Qwen2ForCausalLM(tiny_config(tokenizer, hidden_size=32, num_layers=1)), tokenizer)
    model, tokenizer = _model(Qwen2ForTokenClassification, 2)
    with pytest.raises(ValueError, match="label=2 is not a class of the model, which has 2 labels"):
        ProcessRewardModel(model, tokenizer, label=2)
    assert StepRewards([1.0], [1]).total == 1.0
