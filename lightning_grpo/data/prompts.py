"""Pure helpers of :class:`~lightning_grpo.data.PromptDataModule`: prompt text, length filter, split and collate.

Example::

    from lightning_grpo.data.prompts import collate_prompts, render_prompt

    row = {"question": "2+2?", "answer": "4"}
    text = render_prompt(row, prompt_field="question", prompt_template="Q: {question}\\nA:", where="row 0")
    collate_prompts([{"prompt": text, **row}], columns=["prompt", "question", "answer"])
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable, Sequence
from typing import Any

from lightning_grpo.rewards._text import DATASET_INDEX
from lightning_grpo.rollout.chat import render_messages

__all__ = [
    "IndexedRow",
    "as_messages",
    "collate_prompts",
    "columns_of",
    "prompt_lengths",
    "render_prompt",
    "split_records",
    "template_fields",
]


def template_fields(template: str) -> list[str]:
    """Column names a ``str.format`` template refers to, in order of first use.

    Raises:
        ValueError: The template is malformed or has positional fields (``{}`` or ``{0}``): name the columns.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"prompt_template {template!r} is not a valid str.format template: {err}") from None
    fields: list[str] = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        root = field.split(".")[0].split("[")[0]
        if root == "" or root.isdigit():
            raise ValueError(f"prompt_template {template!r} has a positional field; name a column, e.g. {{question}}")
        if root not in fields:
            fields.append(root)
    return fields


def render_prompt(
    row: dict[str, Any], *, prompt_field: str, prompt_template: str | None, where: str
) -> str | list[dict[str, Any]]:
    """The prompt text of one row: ``prompt_template.format(**row)``, or the row's ``prompt_field`` without one.

    Args:
        row: One record.
        prompt_field: Column holding the prompt, used when there is no template.
        prompt_template: ``str.format`` template over the row's columns, or ``None``.
        where: The row's place for error messages, e.g. ``"train_data row 3"``.

    Raises:
        ValueError: The template names a column the row lacks, or cannot format the row's values.
    """
    if prompt_template is None:
        return row[prompt_field]
    try:
        return prompt_template.format_map(row)
    except KeyError as err:
        raise ValueError(
            f"prompt_template needs column {err.args[0]!r}, missing in {where}; the row has columns {list(row)}"
        ) from None
    except (ValueError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(f"prompt_template {prompt_template!r} cannot format {where}: {err}") from None


def as_messages(prompt: str | list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """The prompt as chat messages: a string becomes the user turn; ``system_prompt`` a first system turn if none.

    The messages are rendered by the tokenizer's chat template in one place, at sampling time (``docs/agents.md``).
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def prompt_lengths(
    tokenizer: Any,
    prompts: Sequence[str | list[dict[str, Any]]],
    chunk_size: int = 1024,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token count of each prompt, without special tokens (``tokenizer(text, add_special_tokens=False)``).

    Conversational prompts are counted as the chat template renders them for sampling (with ``tools``' schemas).
    Texts are tokenized in chunks of ``chunk_size`` so that large datasets stay fast without holding every id list.
    """
    texts = [p if isinstance(p, str) else render_messages(tokenizer, p, tools=tools) for p in prompts]
    lengths: list[int] = []
    for start in range(0, len(texts), chunk_size):
        encoded = tokenizer(list(texts[start : start + chunk_size]), add_special_tokens=False)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
    return lengths


def split_records(records: Sequence[Any], val_split: float, seed: int) -> tuple[list[Any], list[Any]]:
    """A seeded random split into ``(train, val)``; each part keeps the original order.

    ``val`` gets ``round(len(records) * val_split)`` records, at least one when ``val_split > 0``.

    Raises:
        ValueError: The split would leave no training records.
    """
    num_val = max(1, round(len(records) * val_split)) if val_split > 0 else 0
    if num_val >= len(records):
        raise ValueError(
            f"val_split={val_split} of {len(records)} records leaves no training records; lower val_split "
            "or add records"
        )
    val_indices = set(random.Random(seed).sample(range(len(records)), num_val))
    train = [row for i, row in enumerate(records) if i not in val_indices]
    val = [row for i, row in enumerate(records) if i in val_indices]
    return train, val


def columns_of(records: Iterable[dict[str, Any]]) -> list[str]:
    """``"prompt"`` followed by every other column of ``records``, in order of first appearance."""
    columns = {"prompt": None}
    for row in records:
        columns.update(dict.fromkeys(row))
    return list(columns)


class IndexedRow(dict):
    """A data row that remembers its index in the data it came from (``index``); equal to the plain dict."""

    def __init__(self, row: dict[str, Any], *, index: int) -> None:
        super().__init__(row)
        self.index = index


def collate_prompts(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, list[Any]]:
    """Collate rows into a dict of lists, one list per column; a row without a column gives ``None`` there.

    Values are left as they are (no tensors), so strings, numbers and nested objects all pass through. Rows that know
    their index in the data (:class:`IndexedRow`) add a ``dataset_index`` column, unless the data has one.
    """
    batch = {column: [row.get(column) for row in rows] for column in columns}
    indices = [getattr(row, "index", None) for row in rows]
    if DATASET_INDEX not in batch and rows and None not in indices:
        batch[DATASET_INDEX] = indices
    return batch
