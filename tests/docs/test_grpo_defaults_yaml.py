"""docs/configuration.md's one full YAML of ``GRPOConfig`` ("Every setting at its default") is the code's defaults:
every group, every field, every value; and it parses back as a config."""

from __future__ import annotations

import dataclasses
import re

import yaml

from lightning_grpo.config import GROUPS, GRPOConfig
from tests.cli.run_process import REPO

PAGE = REPO / "docs" / "configuration.md"


def _defaults_yaml() -> dict:
    """The ``grpo`` mapping of the first YAML block under the heading "Every setting at its default"."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("### Every setting at its default") :]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL).group(1)
    return yaml.safe_load(block)["model"]["init_args"]["grpo"]


def test_the_full_yaml_shows_every_group_and_field_at_its_default():
    shown = _defaults_yaml()
    defaults = GRPOConfig()
    assert list(shown) == list(GROUPS), "every group, in GRPOConfig's order"
    for group in GROUPS:
        expected = dataclasses.asdict(getattr(defaults, group))
        assert list(shown[group]) == list(expected), f"grpo.{group}: every field, in the class's order"
        assert shown[group] == expected, f"grpo.{group}: the values are the defaults"


def test_the_full_yaml_builds_the_default_config():
    assert GRPOConfig(**_defaults_yaml()) == GRPOConfig()
