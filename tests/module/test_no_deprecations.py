"""A short fit calls no deprecated transformers API (e.g. ``past_key_values``, renamed ``cache``): it would break on a
release a user can install. CI runs the suite under transformers 5.19 (with vLLM) and under the newest release."""

from __future__ import annotations

import logging
import warnings

import pytest

from lightning_grpo.config import UpdateConfig
from tests.conftest import count_a, make_trainer, prompt_loader, tiny_sampling


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _ours_or_transformers(warning: warnings.WarningMessage) -> bool:
    """A deprecation raised in our code or by transformers on our call (its warnings name the torch module hook)."""
    deprecation = issubclass(warning.category, (DeprecationWarning, FutureWarning)) or "deprecated" in str(
        warning.message
    )
    where = warning.filename.replace("\\", "/")
    return deprecation and any(part in where for part in ("lightning_grpo/", "transformers/", "torch/nn/modules/"))


@pytest.mark.parametrize(
    "settings",
    [{}, {"sampling": tiny_sampling(sampler="inverse_cdf", drop_finished=True), "update": UpdateConfig(ppo_epochs=2)}],
)
def test_a_short_fit_calls_no_deprecated_api(make_module, settings):
    records = _Records()
    logging.getLogger("transformers").addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_trainer(max_steps=2).fit(make_module([count_a], **settings), prompt_loader(["1+1=", "2+3="], 2))
    finally:
        logging.getLogger("transformers").removeHandler(records)
    deprecated = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if _ours_or_transformers(w)]
    deprecated += [message for message in records.messages if "deprecated" in message.lower()]
    assert not deprecated, deprecated
