"""``trainer.test`` reports the validation metrics of the test prompts; ``trainer.predict`` writes one JSONL row per
prompt (its completions and, when the reward functions can score the data, their rewards), also with an adapter
exported after training."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from peft import PeftModel

from lightning_grpo import GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.callbacks import PredictionWriter
from lightning_grpo.config import ValidationConfig
from lightning_grpo.rewards import math_answer
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_records, tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout


def is_two(prompts, completions, **_):
    """1.0 for the completion "2"."""
    return [float(c == "2") for c in completions]


def test_test_logs_the_validation_metrics_under_test_with_exact_values(make_module, tokenizer):
    module = make_module(
        reward_funcs=[is_two], module_cls=FixedRolloutModule, validation=ValidationConfig(num_generations=2)
    )
    # prompt 1: one of two solved; prompt 2: none -> accuracy 1/4, reward mean 1/4, pass@2 1/2
    module.fixed = fixed_rollout(tokenizer, ["1+1=", "1+1=", "2+2=", "2+2="], ["2", "3", "5", "6"], group_size=2)
    data = PromptDataModule(prompt_records(4), test_data=prompt_records(2), batch_size=2, val_batch_size=2)
    (results,) = make_trainer().test(module, data)
    assert results == pytest.approx({"test/reward_mean": 0.25, "test/accuracy": 0.25, "test/pass@2": 0.5})
    assert module.val_metrics.accuracy.update_count == 0  # test has metrics of its own


def test_predict_writes_a_row_per_prompt_with_rewards_of_the_sampled_completions(make_module, tmp_path):
    module = make_module(
        reward_funcs=[math_answer],
        validation=ValidationConfig(num_generations=3),
        sampling=tiny_sampling(max_new_tokens=3),
    )
    data = PromptDataModule(prompt_records(8), predict_data=prompt_records(5), batch_size=2, val_batch_size=2)
    trainer = make_trainer(default_root_dir=tmp_path)
    batches = trainer.predict(module, data)
    rows = [row for batch in batches for row in batch]
    written = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert written == rows  # the module's own writer: predictions.jsonl in the run's folder
    assert [row["prompt"] for row in rows] == [record["prompt"] for record in prompt_records(5)]  # data order
    assert [row["dataset_index"] for row in rows] == list(range(5))
    for row, record in zip(rows, prompt_records(5), strict=True):
        assert len(row["completions"]) == 3
        assert row["rewards"] == math_answer([row["prompt"]] * 3, row["completions"], answer=[record["answer"]] * 3)


def test_predict_without_the_column_a_reward_needs_writes_no_rewards_and_says_why_once(make_module, tmp_path):
    module = make_module(reward_funcs=[math_answer])
    prompts = [{"prompt": record["prompt"]} for record in prompt_records(4)]  # no "answer" column
    data = PromptDataModule(prompt_records(4), predict_data=prompts, batch_size=2, val_batch_size=2)
    writer = PredictionWriter(tmp_path / "out.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(callbacks=[writer]).predict(module, data)
    said = [str(w.message) for w in caught if "without rewards" in str(w.message)]
    assert len(said) == 1 and "'math_answer' needs keyword(s) ['answer']" in said[0], said
    rows = [json.loads(line) for line in writer.written.read_text().splitlines()]
    assert writer.written == tmp_path / "out.jsonl" and len(rows) == 4  # the trainer's writer, not the module's
    assert all(set(row) == {"dataset_index", "prompt", "completions"} for row in rows)


def test_predict_with_an_exported_adapter_samples_what_the_trained_module_samples(make_module, tokenizer, tmp_path):
    module = make_module()
    with torch.no_grad():  # a trained adapter, in effect: B is no longer zero
        for name, param in module.policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    module.export_adapter(tmp_path / "adapter")
    base = build_tiny_model(tokenizer)
    loaded = GRPOModule(
        PeftModel.from_pretrained(base, tmp_path / "adapter", is_trainable=True),
        module.rewards,
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=module.config,
    )
    untrained = make_module()
    data = PromptDataModule(prompt_records(4), predict_data=prompt_records(4), batch_size=2)
    samples = [
        make_trainer(callbacks=[PredictionWriter(tmp_path / f"{i}.jsonl")]).predict(m, data)
        for i, m in enumerate((module, loaded, untrained))
    ]
    assert samples[1] == samples[0]
    assert samples[2] != samples[0]  # the adapter changes what is sampled
