"""docs/index.md's examples run as written: each override point's subclass trains a step, the user loss trains too.

The page's sections are read from the Markdown; the examples use no network (a tiny model built in code).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import yaml

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import GROUPS
from lightning_grpo.testing import build_tiny_model
from tests.conftest import count_a, make_trainer, prompt_loader

INDEX = Path(__file__).resolve().parents[2] / "docs" / "index.md"
#: The step each example overrides: every override point of GRPOModule has one.
OVERRIDES = {
    "ShortPromptsGRPO": "generate",
    "ClippedRewardGRPO": "score",
    "MaxBaselineGRPO": "compute_advantages",
    "NoTruncatedGRPO": "prepare_update",
    "FlooredLogProbsGRPO": "compute_logprobs",
    "ReinforceGRPO": "compute_loss",
    "AdapterNormGRPO": "update_policy",
}


def section_blocks(heading: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of the section of docs/index.md under ``## <heading>``."""
    sections = re.split(r"^## ", INDEX.read_text(encoding="utf-8"), flags=re.MULTILINE)
    (section,) = [text for text in sections if text.startswith(heading)]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def _fit_one_step(module: GRPOModule) -> dict:
    trainer = make_trainer(max_steps=1, logger=False)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1= ", "2+2="]))
    return trainer.callback_metrics


def _module(cls: type[GRPOModule], tokenizer, **groups: dict) -> GRPOModule:
    """A tiny module of class ``cls``; ``groups`` of GRPO settings (``objective={...}``) add to the small defaults."""
    sampling = {"num_generations": 4, "max_new_tokens": 6, "max_prompt_length": 16}
    settings = {"sampling": sampling, "update": {"ppo_epochs": 2}}
    for group, values in groups.items():
        settings[group] = {**settings.get(group, {}), **values}
    grpo = GRPOConfig(**{group: GROUPS[group](**values) for group, values in settings.items()})
    return cls(
        build_tiny_model(tokenizer), [count_a], tokenizer=tokenizer, policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=grpo,
    )  # fmt: skip


@pytest.fixture(scope="module")
def override_examples() -> dict:
    (block,) = section_blocks("Override one phase by subclassing")
    namespace: dict = {}
    exec(compile(block, str(INDEX), "exec"), namespace)
    return namespace


def test_every_override_point_has_an_example(override_examples):
    for name, method in OVERRIDES.items():
        cls = override_examples[name]
        assert issubclass(cls, GRPOModule) and method in vars(cls), f"{name} must override {method}"
    overridable = {"generate", "score", "compute_advantages", "prepare_update", "compute_logprobs", "compute_loss"}
    assert overridable | {"update_policy"} == set(OVERRIDES.values())


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_each_override_example_trains_a_step(name, override_examples, tokenizer):
    metrics = _fit_one_step(_module(override_examples[name], tokenizer))
    assert math.isfinite(metrics["train/loss"].item())
    if name == "AdapterNormGRPO":
        assert metrics["train/adapter_norm"] > 0


def test_the_user_loss_of_the_page_trains_from_its_import_path(tmp_path, monkeypatch, tokenizer):
    (loss_source,) = section_blocks("Add your own loss, KL or advantage estimator")
    (yaml_block,) = section_blocks("Add your own loss, KL or advantage estimator", "yaml")
    package = tmp_path / "my_project"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "losses.py").write_text(loss_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_project", raising=False)
    grpo = yaml.safe_load(yaml_block)["model"]["init_args"]["grpo"]
    module = _module(GRPOModule, tokenizer, **grpo)
    metrics = _fit_one_step(module)
    objective = {"loss_kind": "my_project.losses.capped_reinforce", "loss_kind_args": {"max_ratio": 2.0}}
    assert grpo == {"objective": objective}
    assert module.config.component("loss_kind").keywords == {"max_ratio": 2.0}  # the loss's own setting, bound
    assert math.isfinite(metrics["train/loss"].item()) and "train/clip_frac" in metrics
