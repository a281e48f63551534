"""Prompt sources: read records from JSONL/JSON files, lists or Hugging Face datasets.

Every source becomes a ``list[dict]``: one dict per row, the prompt under ``prompt_field`` and any other columns
(answers, metadata for reward functions) beside it. Rows are checked as they are read, and an error names the source
and the row (0-based) and, for JSONL, the line (1-based, as editors count).

Example::

    from lightning_grpo.data import load_records

    records = load_records([{"prompt": "1+1=", "answer": "2"}])
    # load_records("train.jsonl"); load_records("hf:openai/gsm8k@test", prompt_field="question", hf_config="main")
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_grpo.agents.message_checks import validate_messages

__all__ = ["SUFFIXES", "MissingDataError", "PromptSource", "check_source_path", "load_records"]

#: File suffixes :func:`load_records` reads.
SUFFIXES = (".jsonl", ".json")
_HF_PREFIX = "hf:"

#: What :func:`load_records` accepts: a path, ``"hf:<name>[@<split>]"``, a list of dicts, or a ``datasets.Dataset`` /
#: ``DatasetDict`` (typed ``Any`` so that ``datasets`` stays optional).
PromptSource = str | os.PathLike | Sequence[Mapping[str, Any]] | Any


class MissingDataError(FileNotFoundError):
    """A prompt file that does not exist (or has a suffix that cannot be read)."""


def check_source_path(source: PromptSource, argument: str) -> None:
    """Refuse a path ``source`` that does not exist or cannot be read, before anything is loaded or built.

    Sources that are not paths (lists, datasets, ``"hf:..."``) pass; their rows are checked when loaded.

    Raises:
        MissingDataError: Naming the argument, the path (and where it was looked for) and the fix.
    """
    if not isinstance(source, str | os.PathLike) or str(source).startswith(_HF_PREFIX):
        return
    path = Path(source)
    if not path.is_file():
        where = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        raise MissingDataError(
            f"{argument}: prompt file {str(source)!r} not found{where}; pass an existing .jsonl or .json file, "
            "'hf:<dataset name>', or a list of dicts"
        )
    if path.suffix.lower() not in SUFFIXES:
        raise MissingDataError(f"{argument}: {path} has suffix {path.suffix!r}; allowed: {', '.join(SUFFIXES)}")


def load_records(
    source: PromptSource,
    *,
    prompt_field: str | None = "prompt",
    split: str | None = "train",
    hf_config: str | None = None,
) -> list[dict[str, Any]]:
    """Read prompt records from any supported source and check them.

    Args:
        source: One of: a path (``str`` or ``Path``) to a ``.jsonl`` file (one JSON object per line, blank lines
            ignored) or a ``.json`` file (a list of objects); a list of dicts; a ``datasets.Dataset`` (or a
            ``DatasetDict``, from which ``split`` is taken); ``"hf:<name>"`` or ``"hf:<name>@<split>"``, loaded
            with ``datasets.load_dataset(name, hf_config, split=split)``.
        prompt_field: Column holding the prompt, checked to be a non-empty string in every row. ``None`` skips
            that check (for prompts built from other columns by a template).
        split: Split of a Hugging Face dataset. A split written in the source (``"hf:name@test"``) wins; ``None``
            demands one there.
        hf_config: Configuration name of a Hugging Face dataset (e.g. ``"main"`` for ``openai/gsm8k``).

    Returns:
        The records, as new dicts (the source is not modified).

    Raises:
        FileNotFoundError: The path does not exist.
        ValueError: Unknown suffix, invalid JSON, no records, or a bad row; the message names the source and row.
        ImportError: A Hugging Face source without the ``datasets`` package.
    """
    rows, name, lines = _read_source(source, split=split, hf_config=hf_config)
    if len(rows) == 0:
        raise ValueError(f"{name}: no records (the dataset is empty)")
    for index, row in enumerate(rows):
        where = f"{name} row {index}" if lines is None else f"{name} line {lines[index]} (row {index})"
        _check_row(row, where, prompt_field)
    return [dict(row) for row in rows]


def _read_source(source: Any, *, split: str | None, hf_config: str | None) -> tuple[list[Any], str, list[int] | None]:
    """Rows of ``source``, a name for messages, and (JSONL only) the 1-based line number of each row."""
    if isinstance(source, str) and source.startswith(_HF_PREFIX):
        return _load_hf(source[len(_HF_PREFIX) :], hf_config, split), source, None
    if isinstance(source, (str, os.PathLike)):
        return _read_file(Path(source))
    if type(source).__module__.split(".")[0] == "datasets":
        return _hf_rows(source, split, type(source).__name__), type(source).__name__, None
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return list(source), "list", None
    raise TypeError(
        f"Unsupported prompt source of type {type(source).__name__}; pass a path ({', '.join(SUFFIXES)}), "
        f"'hf:<name>', a list of dicts or a datasets.Dataset"
    )


def _read_file(path: Path) -> tuple[list[Any], str, list[int] | None]:
    if not path.exists():
        raise FileNotFoundError(f"Prompt file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; allowed: {', '.join(SUFFIXES)}")
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        rows, lines = _parse_jsonl(text, path)
        return rows, str(path), lines
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: a .json file must hold a list of objects, got {type(rows).__name__}")
    return rows, str(path), None


def _parse_jsonl(text: str, path: Path) -> tuple[list[Any], list[int]]:
    """The rows of a JSONL text and the 1-based line number of each; blank lines are skipped."""
    rows, lines = [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number}: invalid JSON: {err.msg} (column {err.colno})") from None
        lines.append(number)
    return rows, lines


def _load_hf(spec: str, hf_config: str | None, split: str | None) -> list[Any]:
    name, _, written_split = spec.partition("@")
    split = written_split or split
    if not name:
        raise ValueError(f"'hf:{spec}': no dataset name; write 'hf:<name>' or 'hf:<name>@<split>'")
    if split is None:
        raise ValueError(f"'hf:{spec}': name the split to use, e.g. 'hf:{name}@test'")
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"Loading 'hf:{spec}' needs the `datasets` package: pip install 'lightning-grpo[data]'"
        ) from err
    return _hf_rows(datasets.load_dataset(name, hf_config, split=split), split, f"hf:{spec}")


def _hf_rows(dataset: Any, split: str | None, name: str) -> list[Any]:
    if isinstance(dataset, Mapping):  # a DatasetDict
        if split is None or split not in dataset:
            raise ValueError(f"{name}: pick a split with split=...; the dataset has splits {list(dataset)}")
        dataset = dataset[split]
    if not hasattr(dataset, "to_list"):
        raise TypeError(f"{name}: cannot read rows from {type(dataset).__name__}; pass a datasets.Dataset")
    return dataset.to_list()


def _check_row(row: Any, where: str, prompt_field: str | None) -> None:
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected an object (a dict) per row, got {type(row).__name__}")
    if prompt_field is None:
        return
    if prompt_field not in row:
        raise ValueError(
            f"{where}: no prompt field {prompt_field!r}; the row has fields {list(row)} "
            "(choose one with prompt_field=..., or build the prompt with prompt_template=...)"
        )
    prompt = row[prompt_field]
    if isinstance(prompt, list):  # conversational: chat messages, rendered by the chat template when sampling
        validate_messages(prompt, name=f"{where}: prompt field {prompt_field!r}")
        return
    if not isinstance(prompt, str):
        raise ValueError(
            f"{where}: prompt field {prompt_field!r} must be a string or a list of chat messages "
            f'([{{"role": "user", "content": "..."}}]), got {type(prompt).__name__}'
        )
    if not prompt.strip():
        raise ValueError(f"{where}: prompt field {prompt_field!r} is empty")
