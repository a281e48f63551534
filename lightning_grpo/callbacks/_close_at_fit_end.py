"""The base of the callbacks that release what a fit opened (engines, server sessions), finished or failed."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["CloseAtFitEnd"]


class CloseAtFitEnd(Callback):
    """Calls :meth:`close` at the end of fit and on an exception.

    Lightning calls a module's own ``teardown`` only when fit succeeds, a callback's ``on_exception`` also when it
    fails: a subclass says what to close, this class says when.
    """

    def close(self, pl_module: LightningModule) -> None:
        """Release what ``pl_module`` holds open (a subclass's job)."""
        raise NotImplementedError

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.close(pl_module)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.close(pl_module)
