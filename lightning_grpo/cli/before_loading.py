"""What the command line answers before it loads torch, Lightning, transformers and peft (seconds of imports).

``--help``, ``-h``, no arguments and a subcommand without any config are answered from the texts here, in a fraction
of a second; any other command first says on stderr what it loads (stdout stays clean: ``--print_config > file``),
so that its first error is the line after that one. The help lists LightningCLI's subcommands and ``demo``
(:data:`~lightning_grpo.cli.argument_checks.SUBCOMMANDS`; a test compares them with ``LightningCLI.subcommands()``).
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_grpo.cli.argument_checks import PACKAGED_CONFIG, SUBCOMMANDS, refuse_missing_config

__all__ = [
    "DESCRIPTION",
    "SUBCOMMAND_HELP",
    "announce_libraries",
    "announce_loading",
    "answer_without_libraries",
    "building_started",
    "help_text",
    "no_subcommand_message",
    "program_name",
    "usage",
]

#: The command's description: the first paragraph of ``--help``.
DESCRIPTION = (
    "GRPO fine-tuning with LoRA, as a PyTorch Lightning module. First run 'lightning-grpo demo': a tiny model learns "
    "addition on CPU, offline, in about a minute. Subcommands: demo, fit, validate, test, predict. Start a run from a "
    f"config, e.g. the demo's: 'lightning-grpo fit --config {PACKAGED_CONFIG}'. The module's settings: "
    "'lightning-grpo fit --model.help lightning_grpo.GRPOModule' (add --model.grpo.help or --model.policy.help "
    "for GRPOConfig's or PolicyConfig's fields)."
)
#: Each subcommand's line in ``--help``: ``demo`` (run before the parser), then LightningCLI's (the Trainer's words).
SUBCOMMAND_HELP = {
    "demo": "Trains a tiny model on CPU, offline, in about a minute ('demo --help').",
    "fit": "Runs the full optimization routine.",
    "validate": "Perform one evaluation epoch over the validation set.",
    "test": "Perform one evaluation epoch over the test set.",
    "predict": "Run inference on your data.",
}
_OPTIONS = """options:
  -h, --help            Show this help message and exit.
  -c CONFIG, --config CONFIG
                        Path to a configuration file in json or yaml format.
  --print_config[=flags]
                        Print the configuration after applying all other
                        arguments and exit. The optional flags customizes the
                        output and are one or more keywords separated by
                        comma. The supported flags are: skip_default,
                        skip_unset."""
_BUILDING = threading.Event()  # set when the command line starts building what its config names
_LIBRARIES = "torch, Lightning, transformers and peft (10-20 s on 2 cores)"


def program_name() -> str:
    """``python -m lightning_grpo`` when run that way, else ``lightning-grpo`` (the console script)."""
    return "python -m lightning_grpo" if Path(sys.argv[0]).name == "__main__.py" else "lightning-grpo"


def usage(prog: str) -> str:
    """The usage line, as LightningCLI's parser writes it with ``demo`` among the subcommands."""
    return f"usage: {prog} [-c CONFIG] {{{','.join(SUBCOMMAND_HELP)}}} ..."


def no_subcommand_message() -> str:
    """The error for a missing or unknown subcommand (after ``<prog>: error: ``), naming ``demo`` too."""
    return (
        f"no subcommand given: choose one of {', '.join(SUBCOMMAND_HELP)} ('demo' trains a tiny model on CPU in "
        "about a minute; 'fit --config my.yaml' runs a config; --help says more)"
    )


def help_text(prog: str) -> str:
    """``--help``: usage, description, the top-level options and one line per subcommand.

    Example::

        >>> print(help_text("lightning-grpo").splitlines()[0])
        usage: lightning-grpo [-c CONFIG] {demo,fit,validate,test,predict} ...
    """
    wrapped = textwrap.fill(DESCRIPTION, width=79, break_long_words=False, break_on_hyphens=False)
    listed = "\n".join(f"    {name:<20}{line}" for name, line in SUBCOMMAND_HELP.items())
    return (
        f"{usage(prog)}\n\n{wrapped}\n\n{_OPTIONS}\n\nsubcommands:\n  For more details of each subcommand, add it as "
        f"an argument followed by\n  --help.\n\n  Available subcommands:\n{listed}\n"
    )


def answer_without_libraries(argv: Sequence[str], prog: str) -> None:
    """Answer ``--help``, ``-h``, no arguments and a subcommand without a config, then exit; else return.

    Args:
        argv: The arguments, ``--debug`` taken out (:func:`~lightning_grpo.cli.argument_checks.without_debug_flag`).
        prog: The command's name (:func:`program_name`).

    Raises:
        SystemExit: Status 0 after the help; 2 (a usage error, as the parser's) after the usage and its error.
    """
    if argv[:1] and argv[0] in ("-h", "--help"):
        sys.stdout.write(help_text(prog))
        sys.exit(0)
    if not argv:
        sys.stderr.write(f"{usage(prog)}\n{prog}: error: {no_subcommand_message()}\n")
        sys.exit(2)
    refuse_missing_config(argv)


def announce_loading(argv: Sequence[str], prog: str) -> None:
    """Say on stderr what the command loads, before it loads it (nothing when all is loaded already, in-process)."""
    subcommand = f" {argv[0]}" if argv[:1] and argv[0] in ("demo", *SUBCOMMANDS) else ""
    announce_libraries(f"{prog}{subcommand}", until=_BUILDING.is_set)  # parsing the config takes seconds too


def building_started() -> None:
    """End the command line's ``still loading`` lines: it now builds what the config names (which says what it
    does: a model load, a warm-up). Called by :meth:`~lightning_grpo.cli.GRPOCLI.before_instantiate_classes`."""
    _BUILDING.set()


def announce_libraries(who: str, until: Callable[[], bool] | None = None) -> None:
    """Print ``<who>: loading torch, Lightning, transformers and peft...`` on stderr unless they are all loaded, then
    ``<who>: still loading (N s)`` every 8 s (``$LIGHTNING_GRPO_LOADING_TICK`` seconds; ``0``: never) until
    :class:`~lightning_grpo.GRPOModule` exists, or until ``until()`` is true when given (at most a minute).

    The command line and the examples call it before their imports (10-20 s on a busy machine): never silent.
    """
    if all(name in sys.modules for name in ("torch", "lightning", "transformers", "peft")):
        return
    print(f"{who}: loading {_LIBRARIES}...", file=sys.stderr, flush=True)
    every = float(os.environ.get("LIGHTNING_GRPO_LOADING_TICK") or 8.0)
    if every > 0:
        ticker = threading.Thread(target=_tick_while_loading, args=(who, every, until or _module_defined), daemon=True)
        ticker.start()


def _tick_while_loading(who: str, every: float, done: Callable[[], bool], limit: float = 60.0) -> None:
    """Say ``still loading`` every ``every`` seconds until ``done()`` or ``limit`` seconds have passed."""
    start = next_line = time.monotonic()
    while time.monotonic() - start < limit and not done():
        if time.monotonic() >= next_line + every and not done():  # checked again right before the line
            next_line = time.monotonic()
            print(f"{who}: still loading ({next_line - start:.0f} s)", file=sys.stderr, flush=True)
        time.sleep(0.05)


def _module_defined() -> bool:
    """Whether :class:`~lightning_grpo.GRPOModule` is defined: the libraries are loaded."""
    return getattr(sys.modules.get("lightning_grpo.module"), "GRPOModule", None) is not None
