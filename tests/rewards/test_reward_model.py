"""RewardModel: a tiny sequence-classification model built in code, loaded as an object and by path."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

from lightning_grpo.rewards import RewardFunctions, RewardModel
from lightning_grpo.testing import build_tiny_tokenizer, tiny_config


def _classifier(num_labels: int = 1, seed: int = 0) -> tuple[Qwen2ForSequenceClassification, object]:
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=1)
    config.num_labels = num_labels
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config).eval(), tokenizer


def _direct_score(model, tokenizer, text: str) -> float:
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits[0, 0].item()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, tokenizer = _classifier()
    path = tmp_path_factory.mktemp("rm") / "tiny-rm"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


def test_string_prompts_score_prompt_plus_completion_batched_equal_to_one_by_one(saved):
    _, model, tokenizer = saved
    reward = RewardModel(model, tokenizer, batch_size=2)
    prompts, completions = ["1+1=", "12+30=", "5+5="], ["2", "42 and more", "10"]
    scores = reward(prompts, completions)
    expected = [_direct_score(model, tokenizer, p + c) for p, c in zip(prompts, completions, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-5)  # padding in a batch of 2 changes nothing
    assert len(set(round(s, 4) for s in scores)) == 3


def test_loaded_by_path_gives_the_same_scores_and_is_named_after_it(saved):
    path, model, tokenizer = saved
    by_path = RewardModel(str(path))
    assert by_path.name == "tiny-rm"
    assert by_path(["3+4="], ["7"]) == pytest.approx(RewardModel(model, tokenizer)(["3+4="], ["7"]), abs=1e-6)


def test_a_string_in_reward_funcs_becomes_a_reward_model(saved):
    path, model, tokenizer = saved
    reward_fns = RewardFunctions([str(path), lambda completions, **kw: [1.0] * len(completions)], weights=[1.0, 0.0])
    assert isinstance(reward_fns.functions[0], RewardModel) and reward_fns.names == ("tiny-rm", "lambda")
    scores = reward_fns(["1+1="], ["2"])
    assert scores.rewards.tolist() == pytest.approx([_direct_score(model, tokenizer, "1+1=2")], abs=1e-5)


def test_conversational_prompts_use_the_reward_models_chat_template(saved):
    _, model, tokenizer = saved
    if tokenizer.chat_template is None:
        pytest.skip("the tiny tokenizer has no chat template yet")
    reward = RewardModel(model, tokenizer)
    prompt = [{"role": "user", "content": "1+1="}]
    completion = [{"role": "assistant", "content": "2"}]
    text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    assert reward.texts([prompt], [completion]) == [text]
    assert reward([prompt], [completion]) == pytest.approx([_direct_score(model, tokenizer, text)], abs=1e-5)


def test_scoring_runs_without_gradient_and_the_model_is_frozen(saved):
    _, model, tokenizer = saved
    reward = RewardModel(model, tokenizer)
    assert not any(p.requires_grad for p in reward.model.parameters()) and not reward.model.training


def test_place_moves_to_the_dtype_unless_one_was_given(saved):
    path, _, _ = saved
    reward = RewardModel(str(path))
    RewardFunctions([reward]).to("cpu", torch.bfloat16)
    assert next(reward.model.parameters()).dtype == torch.bfloat16
    fixed = RewardModel(str(path), torch_dtype="float32")
    fixed.place("cpu", torch.bfloat16)
    assert next(fixed.model.parameters()).dtype == torch.float32


def test_causal_lm_checkpoint_is_refused_by_path(tmp_path):
    tokenizer = build_tiny_tokenizer()
    Qwen2ForCausalLM(tiny_config(tokenizer, hidden_size=32, num_layers=1)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"is not a sequence-classification model \(its architectures are "):
        RewardModel(str(tmp_path))


def test_loaded_causal_lm_and_two_labels_are_refused():
    tokenizer = build_tiny_tokenizer()
    with pytest.raises(ValueError, match="must be an AutoModelForSequenceClassification; got Qwen2ForCausalLM"):
        RewardModel(Qwen2ForCausalLM(tiny_config(tokenizer, hidden_size=32, num_layers=1)), tokenizer)
    model, tokenizer = _classifier(num_labels=2)
    with pytest.raises(ValueError, match=r"has num_labels=2; a reward model gives one score per sequence"):
        RewardModel(model, tokenizer)


def test_missing_path_and_bad_arguments_are_clear(tmp_path, saved):
    _, model, tokenizer = saved
    with pytest.raises(ValueError, match="could not be loaded"):
        RewardModel(str(tmp_path / "nothing-here"))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        RewardModel(model, tokenizer, batch_size=0)
