from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from lightning_grpo.data import load_records
from lightning_grpo.data.sources import MissingDataError, check_source_path

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4", "level": 1}]


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- each source kind ---------------------------------------------------------------------------------------------


def test_jsonl_file_skips_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [json.dumps(ROWS[0]), "", "   ", json.dumps(ROWS[1])])
    assert load_records(path) == ROWS
    assert load_records(str(path)) == ROWS


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path):
    row = {"prompt": "a\u2028b"}
    path = tmp_path / "u.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert load_records(path) == [row]


def test_json_file_with_a_list(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    assert load_records(path) == ROWS


def test_list_is_copied_not_modified():
    rows = [dict(row) for row in ROWS]
    records = load_records(rows)
    assert records == ROWS
    records[0]["prompt"] = "changed"
    assert rows[0]["prompt"] == "1+1="


def test_custom_prompt_field():
    assert load_records([{"question": "q?"}], prompt_field="question") == [{"question": "q?"}]


def test_prompt_field_none_skips_prompt_checks():
    assert load_records([{"question": "q?"}], prompt_field=None) == [{"question": "q?"}]


# --- Hugging Face sources -----------------------------------------------------------------------------------------


class _FakeDataset:
    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return list(self.rows)


def _fake_datasets_module(calls: list) -> types.ModuleType:
    module = types.ModuleType("datasets")

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return _FakeDataset(ROWS)

    module.load_dataset = load_dataset
    return module


def test_hf_source_calls_load_dataset(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets_module(calls))
    assert load_records("hf:openai/gsm8k", hf_config="main") == ROWS
    assert load_records("hf:openai/gsm8k@test", split="train") == ROWS
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", None, "test")]


def test_hf_source_needs_a_split_when_split_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets_module([]))
    with pytest.raises(ValueError, match=r"'hf:org/data': name the split to use, e.g. 'hf:org/data@test'"):
        load_records("hf:org/data", split=None)


def test_hf_source_needs_a_name():
    with pytest.raises(ValueError, match="no dataset name"):
        load_records("hf:")


def test_hf_source_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ImportError, match=r'pip install "\.\[data\]" in a clone'):
        load_records("hf:openai/gsm8k")
    with pytest.raises(ImportError, match=r'train_data: .hf:openai/gsm8k. needs datasets.*pip install -e "\.\[data\]"'):
        check_source_path("hf:openai/gsm8k", "train_data")  # when the data module is built


def test_hf_dataset_object():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}])
    assert load_records(dataset) == [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]


def test_hf_dataset_dict_takes_the_split():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.DatasetDict(
        train=datasets.Dataset.from_list([{"prompt": "a"}]), test=datasets.Dataset.from_list([{"prompt": "b"}])
    )
    assert load_records(dataset, split="test") == [{"prompt": "b"}]
    with pytest.raises(ValueError, match=r"DatasetDict: pick a split with split=...; the dataset has splits"):
        load_records(dataset, split=None)


def test_hf_source_loads_a_local_dataset_folder(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [json.dumps(row) for row in ROWS[:1]])
    write_jsonl(folder / "test.jsonl", [json.dumps({"prompt": "3+3=", "answer": "6"})])
    assert load_records(f"hf:{folder}") == ROWS[:1]
    assert load_records(f"hf:{folder}@test") == [{"prompt": "3+3=", "answer": "6"}]


def test_hf_dataset_with_a_bad_prompt_names_the_row():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": ""}])
    with pytest.raises(ValueError, match=r"Dataset row 1: prompt field 'prompt' is empty"):
        load_records(dataset)


# --- errors -------------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Prompt file not found: .*nowhere\.jsonl"):
        load_records(tmp_path / "nowhere.jsonl")


def test_unknown_extension_names_allowed_ones(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("prompt\nhi\n")
    with pytest.raises(ValueError, match=r"train\.csv: unsupported file type '\.csv'; allowed: \.jsonl, \.json"):
        load_records(path)


def test_unsupported_source_type():
    with pytest.raises(TypeError, match="Unsupported prompt source of type int"):
        load_records(3)


def test_empty_list():
    with pytest.raises(ValueError, match=r"list: no records \(the dataset is empty\)"):
        load_records([])


def test_empty_jsonl_file(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(ValueError, match=r"empty\.jsonl: no records"):
        load_records(path)


def test_invalid_json_line_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps(ROWS[0]), "", '{"prompt": "x",'])
    with pytest.raises(ValueError, match=r"bad\.jsonl line 3: invalid JSON"):
        load_records(path)


def test_invalid_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[{]")
    with pytest.raises(ValueError, match=r"bad\.json: invalid JSON"):
        load_records(path)


def test_json_file_must_hold_a_list(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text(json.dumps({"data": ROWS}))
    with pytest.raises(ValueError, match=r"obj\.json: a \.json file must hold a list of objects, got dict"):
        load_records(path)


def test_row_that_is_not_an_object_in_a_list():
    with pytest.raises(ValueError, match=r"list row 1: expected an object \(a dict\) per row, got str"):
        load_records([ROWS[0], "just text"])


def test_row_that_is_not_an_object_in_jsonl_names_line_and_row(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [json.dumps(ROWS[0]), "", "[1, 2]"])
    with pytest.raises(ValueError, match=r"rows\.jsonl line 3 \(row 1\): expected an object .* got list"):
        load_records(path)


def test_row_that_is_not_an_object_in_json_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([ROWS[0], 5]))
    with pytest.raises(ValueError, match=r"rows\.json row 1: expected an object .* got int"):
        load_records(path)


def test_missing_prompt_field_lists_the_row_fields():
    with pytest.raises(
        ValueError, match=r"list row 0: no prompt field 'prompt'; the row has fields \['question', 'a'\]"
    ):
        load_records([{"question": "q", "a": "1"}])


def test_missing_prompt_field_in_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [json.dumps(ROWS[0]), json.dumps({"text": "hi"})])
    with pytest.raises(ValueError, match=r"f\.jsonl line 2 \(row 1\): no prompt field 'prompt'; .* \['text'\]"):
        load_records(path)


@pytest.mark.parametrize("value", [3, None, {"role": "user"}])
def test_non_string_prompt(value):
    with pytest.raises(ValueError, match=r"list row 0: prompt field 'prompt' must be a string or a list of chat"):
        load_records([{"prompt": value}])


def test_a_list_prompt_must_hold_chat_messages():
    with pytest.raises(
        ValueError, match=r"list row 0: prompt field 'prompt'\[0\] must be a dict with 'role' and 'content'"
    ):
        load_records([{"prompt": ["a"]}])
    conversation = [{"role": "user", "content": "hi"}]
    assert load_records([{"prompt": conversation}])[0]["prompt"] == conversation


@pytest.mark.parametrize("value", ["", "  \n"])
def test_empty_prompt(value):
    with pytest.raises(ValueError, match=r"list row 1: prompt field 'prompt' is empty"):
        load_records([ROWS[0], {"prompt": value}])


def test_an_hf_source_with_the_hub_unreachable_fails_fast_with_the_download_command(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refuses at once
    with pytest.raises(MissingDataError, match=r"did not answer within 2 s.*HF_HUB_OFFLINE=1.*load_dataset as d"):
        load_records("hf:openai/gsm8k@test", hf_config="main")
