"""``GRPOConfig``'s groups (issue 63): every flat setting of the ungrouped config is refused by its old name with the
one line naming its place now, and every setting of every group has exactly one old name."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from lightning_grpo.config import GROUPS, MOVED_SETTINGS, GRPOConfig, SamplingConfig, ValidationConfig


@pytest.mark.parametrize(("old", "place"), sorted(MOVED_SETTINGS.items()), ids=sorted(MOVED_SETTINGS))
def test_a_flat_setting_is_refused_naming_its_group(old, place):
    group, name = place.split(".")
    default = getattr(getattr(GRPOConfig(), group), name)  # a valid value: the refusal is by name alone
    message = f"GRPOConfig.{old} moved to GRPOConfig.{place} (settings are grouped: docs/configuration.md)"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        GRPOConfig(**{old: default})


def test_the_temperature_example():
    with pytest.raises(TypeError, match=r"^GRPOConfig\.temperature moved to GRPOConfig\.sampling\.temperature "):
        GRPOConfig(temperature=0.5)
    with pytest.raises(TypeError, match=r"^GRPOConfig\.val_temperature moved to GRPOConfig\.validation\.temperature "):
        GRPOConfig(sampling=SamplingConfig(temperature=0.5), val_temperature=0.5)


def test_every_setting_of_every_group_has_one_old_name():
    places = {f"{group}.{field.name}" for group, kind in GROUPS.items() for field in fields(kind)}
    assert sorted(MOVED_SETTINGS.values()) == sorted(places)  # each place once
    assert {old for old, place in MOVED_SETTINGS.items() if place.startswith("validation.")} == {
        f"val_{field.name}" for field in fields(ValidationConfig)
    }
    assert all(old == place.split(".")[1] for old, place in MOVED_SETTINGS.items() if "validation." not in place)


def test_a_group_given_as_a_mapping_becomes_its_dataclass():
    config = GRPOConfig(sampling={"temperature": 0.5}, validation={"temperature": 0.7})
    assert config.sampling == SamplingConfig(temperature=0.5) and config.validation == ValidationConfig(temperature=0.7)
    assert config == GRPOConfig(sampling=SamplingConfig(temperature=0.5), validation=ValidationConfig(temperature=0.7))
