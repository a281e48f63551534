"""The command line's parser: LightningCLI's, whose error is one line and whose usage and help name ``demo`` too.

An error says what is wrong and the fix (``did you mean 'num_generations'?``) on one line, the full message only with
``--debug``; ``demo`` runs before the parser (``lightning_grpo.__main__``), so the usage, the choices and the list of
subcommands name it here; a subcommand's help starts with where GRPO's own settings are explained.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from lightning_grpo.cli.before_loading import SUBCOMMAND_HELP, no_subcommand_message
from lightning_grpo.cli.errors import DEBUG_HINT, debug_enabled, summarize_parse_error
from lightning_grpo.cli.misspelt_settings import misspelt_setting

__all__ = ["SuggestingParser"]

#: Opens ``fit --help`` (and the other subcommands'), before the Trainer's hundreds of lines.
_GRPO_HELP = """GRPO settings only (the Trainer's options follow below):
  {prog} --model.help lightning_grpo.GRPOModule                      the module's arguments
  {prog} --model.help lightning_grpo.GRPOModule --model.grpo.help    GRPOConfig: G, lengths, loss, KL
  {prog} --model.help lightning_grpo.GRPOModule --model.policy.help  PolicyConfig: LoRA, dtype
  {prog} --data.help lightning_grpo.data.PromptDataModule            the prompt data
  {prog} --config my.yaml --print_config                             a run's every setting, as YAML

"""


class SuggestingParser(LightningArgumentParser):
    """LightningCLI's parser; an error is one line with the key, the value, why and the fix (the rest: ``--debug``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """Print what is wrong and the fix (``did you mean 'num_generations'?``); the full message with ``--debug``."""
        if not self.exit_on_error:  # a nested parser: its caller reports
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        options = [o for a in parser._actions for o in a.option_strings]
        summary = misspelt_setting(message, options) or summarize_parse_error(message) or _no_subcommand(message)
        if debug_enabled():
            if summary:
                sys.stderr.write(f"{prog}: error: {summary}\nThe full message:\n")
            super().error(_with_demo(message), ex)
        if summary is None:  # not a setting's value: the message itself, shortened
            lines = _with_demo(message).splitlines()
            summary = "\n".join(lines[:6]) + ("\n..." if len(lines) > 6 else "")
        elif summary.startswith("no subcommand"):
            sys.stderr.write(self.format_usage())
        sys.stderr.write(f"{prog}: error: {summary}\n{DEBUG_HINT}\n")
        self.exit(2)

    def format_usage(self) -> str:
        """Argparse's usage, with ``demo`` among the subcommands (``__main__`` runs it before the parser)."""
        return _with_demo(super().format_usage())

    def format_help(self) -> str:
        """Argparse's help, with ``demo`` among the subcommands; a subcommand's starts with GRPO's settings."""
        text = _with_demo(super().format_help())
        if any("--model.help" in action.option_strings for action in self._actions):
            return _GRPO_HELP.format(prog=self.prog.replace(" [options]", "")) + text
        return text


def _with_demo(text: str) -> str:
    """``text`` with ``demo`` among the subcommands it lists (the usage, the choices, "Available subcommands")."""
    text = text.replace("{fit,validate,test,predict}", "{demo,fit,validate,test,predict}")
    fit = re.search(r"^( +)fit( +)Runs", text, re.MULTILINE)
    if fit and "Available subcommands" in text:
        pad = " " * (len(fit.group(2)) - 1)  # "demo" is one letter longer than "fit"
        demo = f"{fit.group(1)}demo{pad}{SUBCOMMAND_HELP['demo']}\n"
        text = text[: fit.start()] + demo + text[fit.start() :]
    return text.replace("(choose from 'fit',", "(choose from 'demo', 'fit',")


def _no_subcommand(message: str) -> str | None:
    """The error for a missing or unknown subcommand, naming ``demo`` too."""
    if '"subcommand"' not in message:
        return None
    return no_subcommand_message()
