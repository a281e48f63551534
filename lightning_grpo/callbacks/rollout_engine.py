"""Shut the module's rollout engine down when a fit ends, whether it finished or failed."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["CloseRolloutEngine"]


class CloseRolloutEngine(Callback):
    """Close ``pl_module.rollout_engine`` (a colocated vLLM engine, ``docs/vllm.md``) at the end of fit and on an
    exception, so no engine, process or file outlives the run.

    ``GRPOModule`` adds it itself when ``rollout_backend`` is ``"vllm"`` (``configure_callbacks``); Lightning calls a
    module's own ``teardown`` only when fit succeeds, a callback's ``on_exception`` also when it fails.

    Example::

        from lightning import Trainer
        Trainer(callbacks=[CloseRolloutEngine()])  # not needed with GRPOModule: it adds one
    """

    @staticmethod
    def _close(pl_module: LightningModule) -> None:
        engine = getattr(pl_module, "rollout_engine", None)
        if engine is not None:
            engine.close()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close(pl_module)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close(pl_module)
