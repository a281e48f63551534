"""The base of the callbacks that release what a fit (or another trainer run) opened (engines, server sessions),
finished or failed."""

from __future__ import annotations

from typing import ClassVar

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["CloseAtFitEnd"]


class CloseAtFitEnd(Callback):
    """Calls :meth:`close` at the end of fit (and of the other trainer runs in :attr:`stages`) and on an exception.

    Lightning calls a module's own ``teardown`` only when fit succeeds, a callback's ``on_exception`` also when it
    fails: a subclass says what to close, this class says when.

    Attributes:
        stages: The trainer runs (``teardown``'s ``stage``: ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``)
            whose end closes; a validation inside a fit has no teardown of its own.
    """

    stages: ClassVar[frozenset[str]] = frozenset({"fit"})

    def close(self, pl_module: LightningModule) -> None:
        """Release what ``pl_module`` holds open (a subclass's job)."""
        raise NotImplementedError

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.close(pl_module)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage in self.stages:
            self.close(pl_module)
