"""``python -m lightning_grpo fit --config configs/debug/tiny.yaml``: the ``lightning-grpo`` command line.

``python -m lightning_grpo demo`` (and ``lightning-grpo demo``) runs the offline demo
(:mod:`lightning_grpo.demo`, its own subpackage with its config; the test fixtures stay in
:mod:`lightning_grpo.testing`). This entry point is the top of the package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_grpo.cli import main as cli_main

__all__ = ["main"]


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of ``lightning-grpo`` and ``python -m lightning_grpo``; ``demo`` as first argument runs the demo.

    Args:
        args: Arguments instead of ``sys.argv[1:]``; everything but ``demo`` goes to :func:`lightning_grpo.cli.main`.
    """
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["demo"]:  # the offline demo, imported only when asked for
        from lightning_grpo.demo import main as demo

        prog = "python -m lightning_grpo" if Path(sys.argv[0]).name == "__main__.py" else "lightning-grpo"
        demo(argv[1:], prog=f"{prog} demo")
        return
    cli_main(args)


if __name__ == "__main__":
    main()
