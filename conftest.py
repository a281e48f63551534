"""Repository-wide pytest set-up: offline Hugging Face, and ``torch`` in every doctest's namespace."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace: dict) -> None:
    doctest_namespace["torch"] = torch
