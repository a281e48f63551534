"""PromptDataModule: arguments, sources, prompt formatting, length filter, settings from the module."""

from __future__ import annotations

import json
import re
import sys
import types
from types import SimpleNamespace

import pytest
from torch.utils.data import DataLoader

from lightning_grpo.data import PromptDataModule
from lightning_grpo.testing import make_task

ADDITION = make_task("addition", num_samples=20, seed=0)


def first_batch(dm: PromptDataModule) -> dict:
    return next(iter(dm.train_dataloader()))


def attach(dm: PromptDataModule, module=None, world_size: int = 1) -> None:
    """A stand-in for the Trainer: the datamodule reads only these two attributes."""
    dm.trainer = SimpleNamespace(lightning_module=module, world_size=world_size)


# --- argument checks ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
        ({"batch_size": 2.0}, r"batch_size must be an integer >= 1, got 2.0"),
        ({"val_batch_size": 0}, r"val_batch_size must be an integer >= 1 or None, got 0"),
        ({"max_prompt_length": -3}, r"max_prompt_length must be an integer >= 1 or None, got -3"),
        ({"num_workers": -1}, r"num_workers must be an integer >= 0, got -1"),
        ({"val_split": 1.0}, r"val_split must be a finite number in \[0.0, 1.0\), got 1.0"),
        ({"val_split": -0.1}, r"val_split must be a finite number in \[0.0, 1.0\), got -0.1"),
        ({"val_split": 0.2, "val_data": ADDITION}, r"Pass either `val_data` or `val_split` \(got val_split=0.2\)"),
        ({"prompt_field": ""}, r"`prompt_field` must be a non-empty column name"),
        ({"prompt_template": "{}"}, r"has a positional field"),
        ({"prompt_template": 3}, r"`prompt_template` must be a str.format template or None"),
    ],
)
def test_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptDataModule(ADDITION, **kwargs)


# --- sources and formatting ---------------------------------------------------------------------------------------


def test_jsonl_source_and_collate_keeps_every_column(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ADDITION[:4]))
    dm = PromptDataModule(str(path), batch_size=4, shuffle=False)
    batch = first_batch(dm)
    expected = {"prompt": [r["prompt"] for r in ADDITION[:4]], "answer": [r["answer"] for r in ADDITION[:4]]}
    assert batch == {**expected, "dataset_index": [0, 1, 2, 3]}  # each row's index in the data, for error messages


def test_prompt_template_and_original_column_kept():
    rows = [{"question": f"{i}+{i}?", "answer": str(2 * i), "level": i % 2} for i in range(4)]
    dm = PromptDataModule(rows, prompt_field="question", prompt_template="Question: {question}\nAnswer:", batch_size=2)
    dm.setup("fit")
    batch = next(iter(DataLoader(dm.train_records, **dm._loader_options(dm.train_records, 4, drop_last=False))))
    assert list(batch) == ["prompt", "question", "answer", "level", "dataset_index"]
    assert batch["prompt"][1] == "Question: 1+1?\nAnswer:"
    assert batch["question"] == [r["question"] for r in rows]
    assert batch["level"] == [0, 1, 0, 1]


def test_custom_prompt_field_without_template():
    rows = [{"question": "1+1=", "answer": "2"}] * 2
    dm = PromptDataModule(rows, prompt_field="question", batch_size=2)
    batch = first_batch(dm)
    assert batch == {"prompt": ["1+1="] * 2, "question": ["1+1="] * 2, "answer": ["2"] * 2, "dataset_index": [0, 1]}


def test_prompt_template_missing_key_names_key_and_row():
    rows = [{"question": "a", "topic": "t"}, {"question": "b"}]
    dm = PromptDataModule(rows, prompt_template="{topic}: {question}", batch_size=1)
    with pytest.raises(ValueError, match=r"needs column 'topic', missing in train_data row 1; .* \['question'\]"):
        dm.setup("fit")


def test_template_replaces_the_prompt_field_check():
    dm = PromptDataModule([{"q": "x"}], batch_size=1)
    with pytest.raises(ValueError, match=r"list row 0: no prompt field 'prompt'; the row has fields \['q'\]"):
        dm.setup("fit")
    dm = PromptDataModule([{"q": "x"}], prompt_template="Q: {q}", batch_size=1)
    assert first_batch(dm)["prompt"] == ["Q: x"]


def test_system_prompt_without_chat_template_is_a_prefix_line():
    dm = PromptDataModule(ADDITION[:2], system_prompt="Add the numbers.", batch_size=2, shuffle=False)
    assert first_batch(dm)["prompt"] == [f"Add the numbers.\n{r['prompt']}" for r in ADDITION[:2]]


def test_chat_template_makes_conversations_with_a_system_turn(chat_tokenizer):
    dm = PromptDataModule(
        ADDITION[:2], tokenizer=chat_tokenizer, chat_template=True, system_prompt="Add.", batch_size=2, shuffle=False
    )
    prompt = ADDITION[0]["prompt"]
    assert first_batch(dm)["prompt"][0] == [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": prompt},
    ]  # kept as messages: the module renders them with the template when it samples


def test_chat_template_without_system_prompt(chat_tokenizer):
    dm = PromptDataModule(ADDITION[:1], tokenizer=chat_tokenizer, chat_template=True, batch_size=1)
    assert first_batch(dm)["prompt"] == [[{"role": "user", "content": ADDITION[0]["prompt"]}]]


def test_chat_template_needs_one_in_the_tokenizer(tokenizer):
    tokenizer.chat_template = None
    dm = PromptDataModule(ADDITION, tokenizer=tokenizer, chat_template=True)
    with pytest.raises(ValueError, match=r"train_data row 0: .* need a tokenizer with a chat template"):
        dm.setup("fit")


def test_conversational_records_are_kept_as_messages(chat_tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}] * 2
    dm = PromptDataModule(rows, tokenizer=chat_tokenizer, max_prompt_length=64, batch_size=2, shuffle=False)
    batch = first_batch(dm)
    assert batch["prompt"] == [rows[0]["prompt"]] * 2 and batch["answer"] == ["4", "4"]


def test_conversational_prompts_are_filtered_by_their_rendered_length(chat_tokenizer, recwarn):
    rows = [{"prompt": [{"role": "user", "content": "x" * n}]} for n in (2, 30)]
    dm = PromptDataModule(rows, tokenizer=chat_tokenizer, max_prompt_length=len("<user>xx\n<assistant>"), batch_size=1)
    dm.setup("fit")  # the 2-character prompt fits only if the template's tokens are counted exactly
    assert [r["prompt"][0]["content"] for r in dm.train_records] == ["xx"]


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        (
            [{"role": "robot", "content": "hi"}],
            r"row 0: prompt field 'prompt'\[0\] has role 'robot'; the allowed roles are system, user",
        ),
        ([{"role": "user"}], r"row 0: prompt field 'prompt'\[0\].*content"),
        (42, r"must be a string or a list of chat messages"),
    ],
)
def test_malformed_conversations_are_refused_naming_the_row(prompt, match):
    with pytest.raises(ValueError, match=match):
        PromptDataModule([{"prompt": prompt}]).setup("fit")


def test_tokenizer_given_by_path(tmp_path, chat_tokenizer):
    chat_tokenizer.save_pretrained(tmp_path / "tok")
    dm = PromptDataModule(ADDITION[:1], tokenizer=str(tmp_path / "tok"), chat_template=True, batch_size=1)
    dm.setup("fit")
    assert not isinstance(dm.tokenizer, str)
    assert dm.train_records[0]["prompt"] == [{"role": "user", "content": ADDITION[0]["prompt"]}]


# --- length filter ------------------------------------------------------------------------------------------------


def test_long_prompts_are_dropped_with_one_counted_warning(tokenizer, recwarn):
    rows = [{"prompt": "x" * n} for n in range(1, 11)]  # lengths 1..10 tokens
    dm = PromptDataModule(
        rows, val_data=[{"prompt": "yyyyyyyy"}, {"prompt": "y"}], tokenizer=tokenizer, max_prompt_length=7, batch_size=2
    )
    dm.setup("fit")
    messages = [str(w.message) for w in recwarn if "dropped" in str(w.message)]
    assert messages == ["PromptDataModule dropped 4 of 12 prompts longer than max_prompt_length=7 (train: 3, val: 1)"]
    assert [len(r["prompt"]) for r in dm.train_records] == list(range(1, 8))
    assert dm.val_records == [{"prompt": "y"}]


def test_length_counts_the_formatted_prompt(tokenizer):
    dm = PromptDataModule(
        [{"prompt": "abc"}, {"prompt": "a"}],
        system_prompt="sys",
        tokenizer=tokenizer,
        max_prompt_length=5,
        batch_size=1,
    )
    with pytest.warns(UserWarning, match=re.escape("dropped 1 of 2 prompts longer than max_prompt_length=5")):
        dm.setup("fit")
    assert dm.train_records == [{"prompt": "sys\na"}]  # "sys\nabc" is 7 tokens


def test_no_warning_when_nothing_is_dropped(tokenizer, recwarn):
    PromptDataModule(ADDITION, tokenizer=tokenizer, max_prompt_length=4).setup("fit")
    assert not [w for w in recwarn if "dropped" in str(w.message)]


def test_all_prompts_too_long_is_an_error(tokenizer):
    dm = PromptDataModule(ADDITION, tokenizer=tokenizer, max_prompt_length=2)
    with (
        pytest.raises(ValueError, match=r"All 20 train prompts are longer than max_prompt_length=2 tokens"),
        pytest.warns(UserWarning, match="dropped 20 of 20"),
    ):
        dm.setup("fit")


def test_max_prompt_length_needs_a_tokenizer():
    with pytest.raises(ValueError, match=r"max_prompt_length=8 needs a tokenizer"):
        PromptDataModule(ADDITION, max_prompt_length=8).setup("fit")


# --- taking settings from the attached module ---------------------------------------------------------------------


def test_tokenizer_and_max_prompt_length_come_from_the_module(tokenizer):
    dm = PromptDataModule([*ADDITION, {"prompt": "1234567890+1=", "answer": "x"}], batch_size=4)
    attach(dm, SimpleNamespace(tokenizer=tokenizer, max_prompt_length=8))
    with pytest.warns(UserWarning, match="dropped 1 of 21"):
        dm.setup("fit")
    assert dm.tokenizer is tokenizer and dm.max_prompt_length == 8
    assert len(dm.train_records) == 20


def test_explicit_settings_win_over_the_module(tokenizer, chat_tokenizer):
    dm = PromptDataModule(ADDITION, tokenizer=tokenizer, max_prompt_length=64)
    attach(dm, SimpleNamespace(tokenizer=chat_tokenizer, max_prompt_length=2))
    dm.setup("fit")
    assert dm.tokenizer is tokenizer and dm.max_prompt_length == 64


def test_module_without_those_attributes_is_fine():
    dm = PromptDataModule(ADDITION)
    attach(dm, SimpleNamespace())
    dm.setup("fit")
    assert dm.tokenizer is None and dm.max_prompt_length is None


def test_prepare_data_loads_only_hf_sources(monkeypatch):
    calls = []
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, config=None, split=None: calls.append((name, config, split)) or _Rows(ADDITION)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    PromptDataModule("hf:org/train", val_data="hf:org/val@test", hf_config="main").prepare_data()
    PromptDataModule(ADDITION, val_data=ADDITION[:4]).prepare_data()
    assert calls == [("org/train", "main", "train"), ("org/val", "main", "test")]


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return list(self.rows)


def test_setup_runs_once():
    dm = PromptDataModule(ADDITION)
    dm.setup("fit")
    records = dm.train_records
    dm.setup("validate")
    assert dm.train_records is records
