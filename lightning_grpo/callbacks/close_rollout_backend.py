"""Shut the module's rollout backend down when a fit (validate, test, predict) ends, whether it finished or failed."""

from __future__ import annotations

from typing import ClassVar

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_grpo.callbacks._close_at_fit_end import CloseAtFitEnd

__all__ = ["CloseRolloutBackend"]


class CloseRolloutBackend(CloseAtFitEnd):
    """Close ``pl_module.rollout_backend`` (:class:`~lightning_grpo.backends.RolloutBackend`: a colocated vLLM
    engine, a user's server connection) at the end of fit and on an exception, so nothing outlives the run; at the end
    of a validate, test or predict of its own too (``GRPOModule`` starts the backend for each of them).

    ``GRPOModule`` adds it itself (``configure_callbacks``): this callback is the one place a backend is closed.
    Lightning calls a module's own ``teardown`` only when fit succeeds, a callback's ``on_exception`` also when it
    fails.

    Example::

        from lightning import Trainer
        Trainer(callbacks=[CloseRolloutBackend()])  # not needed with GRPOModule: it adds one
    """

    stages: ClassVar[frozenset[str]] = frozenset({"fit", "validate", "test", "predict"})

    @override
    def close(self, pl_module: LightningModule) -> None:
        backend = getattr(pl_module, "rollout_backend", None)
        if backend is not None:
            backend.close()
