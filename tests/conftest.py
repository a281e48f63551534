"""Shared fixtures: a tiny offline model and tokenizer, and a factory for small GRPO modules and trainers."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import SamplingConfig
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer, load_tiny_model

# The "still loading (N s)" lines of the command line and the examples are off in the tests' subprocesses, whose
# assertions place each line after the loading line; tests/cli/test_start_up.py switches them on where it checks them.
os.environ["LIGHTNING_GRPO_LOADING_TICK"] = "0"

warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")


REPO = Path(__file__).resolve().parents[1]


def repo_pythonpath() -> str:
    """``PYTHONPATH`` for a subprocess that imports the repository's package and tests: the repository first, then
    whatever the caller's ``PYTHONPATH`` holds (a machine whose packages live on it keeps them)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def count_a(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Fraction of the completion's characters that are the letter ``a`` (an easy signal for tiny models)."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def prompt_records(n: int = 8) -> list[dict[str, str]]:
    return [{"prompt": f"{i % 10}+{(i * 3) % 10}=", "answer": str(i % 10 + (i * 3) % 10)} for i in range(n)]


@pytest.fixture
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def warm_tiny_cache() -> None:
    """Build (or load) the warmed-up ``TinyModel("addition")`` once, so that timed tests do not pay for the warm-up."""
    load_tiny_model("addition")


def tiny_sampling(**settings: Any) -> SamplingConfig:
    """The sampling of the tiny test runs (4 samples of at most 6 tokens after prompts of at most 16 tokens), with
    ``settings`` (its fields) changed: ``make_module(sampling=tiny_sampling(temperature=0.8))``."""
    return SamplingConfig(**{"num_generations": 4, "max_new_tokens": 6, "max_prompt_length": 16, **settings})


@pytest.fixture
def make_module(tokenizer) -> Callable[..., GRPOModule]:
    """Build a GRPOModule over a fresh tiny model (seed 0): ``make_module(reward_funcs=..., **groups)``, each group of
    ``GRPOConfig`` by its name (``objective=ObjectiveConfig(kl_coef=0.0)``); ``sampling`` defaults to
    :func:`tiny_sampling`."""

    def build(
        reward_funcs: Any = (count_a,),
        *,
        lr: float = 1e-2,
        policy: PolicyConfig | None = None,
        module_cls: type[GRPOModule] = GRPOModule,
        lr_scheduler: Any = None,
        sampling: SamplingConfig | None = None,
        **groups: Any,
    ) -> GRPOModule:
        return module_cls(
            build_tiny_model(tokenizer),
            list(reward_funcs),
            tokenizer=tokenizer,
            policy=policy or PolicyConfig(lora_r=4, lora_alpha=8),
            grpo=GRPOConfig(sampling=sampling or tiny_sampling(), **groups),
            optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
            lr_scheduler=lr_scheduler,
        )

    return build


def prompt_loader(prompts: list[str], repeat: int = 1) -> DataLoader:
    """A loader yielding ``{"prompt": prompts}`` ``repeat`` times, as PromptDataModule batches look."""
    rows = [{"prompt": p} for p in prompts] * repeat
    return DataLoader(rows, batch_size=len(prompts), collate_fn=lambda batch: {"prompt": [r["prompt"] for r in batch]})


def make_trainer(**kwargs: Any) -> L.Trainer:
    """A quiet CPU trainer."""
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return L.Trainer(**{**options, **kwargs})
