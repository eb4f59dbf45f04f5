"""The `metrics` op: this manager's registry in the Prometheus text format."""

from __future__ import annotations

from typing import Protocol

from manager.daemon.handlers.table import Table
from manager.daemon.metrics import Metrics
from protocol import control


class MetricsOpsOwner(Protocol):
    @property
    def metrics(self) -> Metrics: ...


class MetricsHandlers:
    def __init__(self, mgr: MetricsOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.METRICS, self.metrics)

    async def metrics(self, _args: control.NoArgs) -> control.MetricsReply:
        # The exposition is ASCII but for label values, which are seat names and states.
        return control.MetricsReply(text=self.mgr.metrics.text().decode())
