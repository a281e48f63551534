"""The tiny character-level tokenizer, built in code: no download, one token per character.

Example::

    from lightning_grpo.testing import TinyTokenizer

    tokenizer = TinyTokenizer()
    assert tokenizer.decode(tokenizer("3+4=7", add_special_tokens=False)["input_ids"]) == "3+4=7"
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["ALPHABET", "TinyTokenizer", "build_tiny_tokenizer"]

#: Characters the tiny tokenizer knows, one token each.
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
_SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


def _character_tokenizer() -> Tokenizer:
    """The ``tokenizers`` core: the special tokens, then one word-level entry per character of :data:`ALPHABET`."""
    specials = [_SPECIAL["pad"], _SPECIAL["eos"], _SPECIAL["bos"], _SPECIAL["unk"]]
    vocab = {tok: i for i, tok in enumerate(specials + list(ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_SPECIAL["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return core


def _chat_template() -> str | None:
    """The tiny chat template, where the testing package has one (``lightning_grpo/testing/chat_template.py``)."""
    try:
        from lightning_grpo.testing.chat_template import TINY_CHAT_TEMPLATE
    except ImportError:
        return None
    return TINY_CHAT_TEMPLATE


#: How the tiny chat template renders one tool; TinyToolTokenizer renders its name instead.
_TOOL_SCHEMA = (
    "{{ dict(name=fn.name, description=fn.description, parameters=fn.parameters) | tojson(separators=[',', ':']) }}"
)


class TinyTokenizer(PreTrainedTokenizerFast):
    """A character-level fast tokenizer: one token per character of :data:`ALPHABET`, plus special tokens.

    ``decode(encode(text)) == text`` for any text over the alphabet. Padding is on the left, as GRPO generation
    wants. In a YAML config: ``tokenizer: {class_path: lightning_grpo.testing.TinyTokenizer}``.

    ``save_pretrained`` records the class as ``PreTrainedTokenizerFast``, so ``AutoTokenizer.from_pretrained``
    reloads a saved copy without this package.

    Args:
        with_pad: Give the tokenizer a pad token. ``False`` builds one without, as many base-model tokenizers are.
        **kwargs: Passed to ``PreTrainedTokenizerFast`` (``from_pretrained`` passes the saved settings here).
    """

    def __init__(self, with_pad: bool = True, **kwargs: Any) -> None:
        if "tokenizer_object" not in kwargs and "tokenizer_file" not in kwargs:
            kwargs["tokenizer_object"] = _character_tokenizer()
        defaults = {
            "eos_token": _SPECIAL["eos"],
            "bos_token": _SPECIAL["bos"],
            "unk_token": _SPECIAL["unk"],
            "pad_token": _SPECIAL["pad"] if with_pad else None,
            "padding_side": "left",
        }
        super().__init__(**{**defaults, **kwargs})
        template = _chat_template()
        if template is not None and self.chat_template is None:
            self.chat_template = template

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> tuple[str, ...]:
        """Save as ``PreTrainedTokenizerFast`` does, naming that class, so AutoTokenizer can reload it."""
        files = super().save_pretrained(save_directory, *args, **kwargs)
        config_path = Path(save_directory) / "tokenizer_config.json"
        if config_path.exists():
            config = json.loads(config_path.read_text(encoding="utf-8"))
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return files


class TinyToolTokenizer(TinyTokenizer):
    """:class:`TinyTokenizer` with a chat template that lists tools by name only: the tokenizer of
    :class:`~lightning_grpo.testing.TinyToolModel` (a full JSON schema would make tiny prompts four times longer).

    In a YAML config: ``tokenizer: {class_path: lightning_grpo.testing.TinyToolTokenizer}``.

    Args:
        **kwargs: As :class:`TinyTokenizer`'s.

    Raises:
        RuntimeError: The tiny chat template no longer renders tool schemas as this expects.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        template = _chat_template()
        if template is None or _TOOL_SCHEMA not in template:
            raise RuntimeError(
                "the tiny chat template no longer renders tool schemas as expected; update TinyToolTokenizer"
            )
        self.chat_template = template.replace(_TOOL_SCHEMA, "{{ fn.name }}")


def build_tiny_tokenizer(*, with_pad: bool = True) -> TinyTokenizer:
    """A :class:`TinyTokenizer`.

    Args:
        with_pad: Give the tokenizer a pad token. ``False`` builds one without, as many base-model tokenizers are.

    Returns:
        A fast tokenizer whose ``decode(encode(text)) == text`` for any text over the alphabet.
    """
    return TinyTokenizer(with_pad=with_pad)
