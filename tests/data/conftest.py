"""Fixtures of the data tests: offline Hugging Face hub, the tiny character-level tokenizer."""

from __future__ import annotations

import pytest

from lightning_grpo.testing import build_tiny_tokenizer

#: A minimal chat template: one ``<role>content`` line per message, then ``<assistant>`` for the reply.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def chat_tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
