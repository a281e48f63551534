from __future__ import annotations

import pytest

from lightning_grpo.data.prompts import (
    as_messages,
    collate_prompts,
    columns_of,
    prompt_lengths,
    render_prompt,
    split_records,
    template_fields,
)


def test_template_fields_in_order_of_first_use():
    assert template_fields("Q: {question} ({level}) {question}") == ["question", "level"]
    assert template_fields("{meta[source]} {obj.name}") == ["meta", "obj"]
    assert template_fields("no fields {{literal}}") == []


@pytest.mark.parametrize("template", ["{} + {}", "{0}"])
def test_template_fields_refuse_positional_fields(template):
    with pytest.raises(ValueError, match="has a positional field; name a column"):
        template_fields(template)


def test_template_fields_refuse_malformed_templates():
    with pytest.raises(ValueError, match=r"is not a valid str\.format template"):
        template_fields("Q: {question")


def test_render_prompt_with_and_without_template():
    row = {"question": "2+2?", "answer": 4}
    assert render_prompt(row, prompt_field="question", prompt_template=None, where="row 0") == "2+2?"
    text = render_prompt(row, prompt_field="question", prompt_template="Q: {question}\nA ({answer}):", where="row 0")
    assert text == "Q: 2+2?\nA (4):"


def test_render_prompt_missing_key_names_key_and_row():
    with pytest.raises(ValueError, match=r"needs column 'topic', missing in train_data row 7; .* \['question'\]"):
        render_prompt(
            {"question": "q"}, prompt_field="prompt", prompt_template="{topic}: {question}", where="train_data row 7"
        )


def test_render_prompt_bad_format_spec_names_the_row():
    with pytest.raises(ValueError, match=r"cannot format val_data row 2"):
        render_prompt({"n": "x"}, prompt_field="prompt", prompt_template="{n:d}", where="val_data row 2")


def test_as_messages_with_and_without_system():
    assert as_messages("1+1=", None) == [{"role": "user", "content": "1+1="}]
    assert as_messages("1+1=", "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
    ]


def test_as_messages_keeps_a_conversation_and_its_own_system_turn():
    conversation = [{"role": "system", "content": "Own."}, {"role": "user", "content": "hi"}]
    assert as_messages(conversation, "Other.") == conversation  # an existing system turn wins
    assert as_messages(conversation[1:], "Other.")[0] == {"role": "system", "content": "Other."}


def test_prompt_lengths_of_conversations_count_the_rendered_template(chat_tokenizer):
    conversation = [{"role": "user", "content": "1+1="}]
    rendered = "<user>1+1=\n<assistant>"  # CHAT_TEMPLATE of tests/data/conftest.py, generation prompt added
    assert prompt_lengths(chat_tokenizer, [conversation, "1+1="]) == [len(rendered), 4]


def test_prompt_lengths_match_single_calls_and_chunking(tokenizer):
    texts = ["1+1=", "hello world", "x" * 40, "a"]
    expected = [len(tokenizer(text, add_special_tokens=False).input_ids) for text in texts]
    assert expected == [4, 11, 40, 1]  # one token per character
    assert prompt_lengths(tokenizer, texts) == expected
    assert prompt_lengths(tokenizer, texts, chunk_size=3) == expected


def test_split_records_is_seeded_disjoint_and_ordered():
    records = list(range(20))
    train, val = split_records(records, 0.25, seed=0)
    assert len(val) == 5 and len(train) == 15
    assert sorted(train + val) == records
    assert train == sorted(train) and val == sorted(val)  # original order kept
    assert split_records(records, 0.25, seed=0) == (train, val)
    assert split_records(records, 0.25, seed=1) != (train, val)


def test_split_records_holds_out_at_least_one():
    train, val = split_records(list(range(10)), 0.01, seed=0)
    assert len(val) == 1 and len(train) == 9
    assert split_records([1, 2], 0.0, seed=0) == ([1, 2], [])


def test_split_records_refuses_to_empty_train():
    with pytest.raises(ValueError, match=r"val_split=0.9 of 2 records leaves no training records"):
        split_records([1, 2], 0.9, seed=0)


def test_columns_and_collate():
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2", "level": 3}]
    columns = columns_of(rows)
    assert columns == ["prompt", "answer", "level"]
    assert collate_prompts(rows, columns) == {"prompt": ["a", "b"], "answer": ["1", "2"], "level": [None, 3]}
