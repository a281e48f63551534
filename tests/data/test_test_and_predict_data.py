"""``PromptDataModule``'s ``test_data`` and ``predict_data``: in-order batches, read only when asked for, long prompts
dropped with one warning, and one clear line for a missing setting or file."""

from __future__ import annotations

import json

import pytest

from lightning_grpo.data import MissingDataError, PromptDataModule
from lightning_grpo.settings_checks import SettingError
from tests.conftest import prompt_records


def test_test_and_predict_batches_keep_the_data_order_in_val_batch_size(tmp_path):
    path = tmp_path / "predict.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(5)))
    data = PromptDataModule(
        prompt_records(4), test_data=prompt_records(6), predict_data=str(path), batch_size=4, val_batch_size=2
    )
    data.setup("predict")
    assert data.held_records == {}  # nothing read before a loader is asked for
    test = [batch["prompt"] for batch in data.test_dataloader()]
    assert test == [[r["prompt"] for r in prompt_records(6)][i : i + 2] for i in (0, 2, 4)]
    predict = list(data.predict_dataloader())
    assert [b["prompt"] for b in predict] == [["0+1=", "1+1="], ["2+1=", "3+1="], ["4+1="]]  # the last one kept
    assert predict[1]["dataset_index"] == [2, 3] and set(predict[0]) == {"prompt", "dataset_index"}


def test_a_stage_without_its_data_is_one_line_naming_the_setting():
    data = PromptDataModule(prompt_records(4))
    with pytest.raises(SettingError, match=r"^predict_data is None: trainer.predict \(lightning-grpo predict\)") as e:
        data.predict_dataloader()
    assert "data.init_args.predict_data" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SettingError, match=r"^test_data is None: trainer.test"):
        data.test_dataloader()


def test_a_missing_test_file_fails_when_the_data_module_is_built(tmp_path):
    with pytest.raises(MissingDataError, match=r"^test_data: prompt file .*nope.jsonl.* not found"):
        PromptDataModule(prompt_records(4), test_data=str(tmp_path / "nope.jsonl"))


def test_long_prompts_are_dropped_with_one_warning_and_all_long_is_an_error(tokenizer):
    long = [{"prompt": "1+1=" * 10}]
    data = PromptDataModule(
        prompt_records(4),
        test_data=prompt_records(3) + long,
        predict_data=long,
        tokenizer=tokenizer,
        max_prompt_length=8,
    )
    data.setup("test")
    with pytest.warns(UserWarning, match=r"dropped 1 of 4 test_data prompts longer than max_prompt_length=8"):
        (batch,) = data.test_dataloader()
    assert len(batch["prompt"]) == 3
    with pytest.raises(ValueError, match=r"All 1 predict_data prompts are longer than max_prompt_length=8"):
        data.predict_dataloader()
