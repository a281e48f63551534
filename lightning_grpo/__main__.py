"""``python -m lightning_grpo fit --config configs/debug/tiny.yaml``: the ``lightning-grpo`` command line.

``python -m lightning_grpo demo`` (and ``lightning-grpo demo``) runs the offline demo
(:mod:`lightning_grpo.demo`, its own subpackage with its config; the test fixtures stay in
:mod:`lightning_grpo.testing`). This entry point is the top of the package.

``--help``, ``-h``, no arguments and a subcommand without a config are answered before torch, Lightning,
transformers and peft are imported (:mod:`lightning_grpo.cli.before_loading`); any other command first says on
stderr that it loads them, then imports the command line or the demo.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning_grpo.cli.argument_checks import without_debug_flag
from lightning_grpo.cli.before_loading import announce_loading, answer_without_libraries, program_name

__all__ = ["main"]


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of ``lightning-grpo`` and ``python -m lightning_grpo``; ``demo`` as first argument runs the demo.

    Args:
        args: Arguments instead of ``sys.argv[1:]``; everything but ``demo`` goes to :func:`lightning_grpo.cli.main`.

    Raises:
        SystemExit: After ``--help`` (status 0); no arguments, a subcommand without a config, or arguments that do
            not parse (status 2); an error the message explains (status 1).
    """
    argv = list(sys.argv[1:] if args is None else args)
    prog = program_name()
    if argv[:1] == ["demo"]:  # the offline demo, imported only when asked for
        announce_loading(argv, prog)
        from lightning_grpo.demo import main as demo

        demo(argv[1:], prog=f"{prog} demo")
        return
    argv = without_debug_flag(args)  # sets LIGHTNING_GRPO_DEBUG; lightning_grpo.cli.main takes it out again
    answer_without_libraries(argv, prog)
    announce_loading(argv, prog)
    from lightning_grpo.cli import main as cli_main  # torch, Lightning, transformers, peft: seconds

    cli_main(args)


if __name__ == "__main__":
    main()
