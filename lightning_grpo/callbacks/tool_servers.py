"""End the module's MCP tool-server sessions when a fit ends, whether it finished or failed."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["CloseToolServers"]


class CloseToolServers(Callback):
    """Close the MCP tool servers of ``pl_module.agent`` (``docs/agents.md``, "MCP tool servers") at the end of fit
    and on an exception, so no server subprocess outlives the run. A later fit reopens them on first use.

    ``GRPOModule`` adds it itself when ``tools=`` names a server (``configure_callbacks``).

    Example::

        from lightning import Trainer
        Trainer(callbacks=[CloseToolServers()])  # not needed with GRPOModule: it adds one
    """

    @staticmethod
    def _close(pl_module: LightningModule) -> None:
        agent = getattr(pl_module, "agent", None)
        if agent is not None and hasattr(agent, "close"):
            agent.close()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close(pl_module)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close(pl_module)
