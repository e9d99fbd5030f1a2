"""A step's loss and hits, kept on the device and read one step later (issue 34: no host sync per step).

Reading a CUDA value at the end of a step (``.tolist()``, ``float()``) makes the host wait for
every kernel of that step, and the step's bookkeeping (agreement, records, sampler) then runs
while the GPU idles. So a step leaves its loss and hits as device scalars on their way to
the host (``noise/deferred.Deferred``: an asynchronous copy to pinned memory and a CUDA event),
and the rank reads them at the end of the *next* step, once that step's kernels are queued:
the device always has work while the host reads. The step's agreement is issued then, with
values already complete (``rank/agreement.py`` reads host floats, as before); records and
reports come one step later than the step, which nothing decides on (plans and evaluations
are decided on each agreement's own fields, issued at the same boundary on every rank).

On the CPU the values are there at once; the read costs nothing and nothing waits.
"""

from __future__ import annotations

import dataclasses

import torch

from elastic_tasks.rank.agreement import StepOutcome
from elastic_tasks.rank.noise.deferred import Deferred


class StepSums:
    """One step's loss and hits over its micro-batches, summed on the device.

    ``add(weighted, n, hits)``: ``weighted`` is the micro-batch's mean loss times its weight
    ``n / global_batch`` — the very tensor that goes into backward — so the sum costs no
    kernel for the first micro-batch and one add for each further one; the loss sum over the
    rank's samples is the result times the global batch (applied on the host)."""

    def __init__(self) -> None:
        self.loss: torch.Tensor | None = None
        self.hits: torch.Tensor | float = 0.0

    def add(self, weighted: torch.Tensor, hits: object) -> None:
        weighted = weighted.detach()
        self.loss = weighted if self.loss is None else self.loss + weighted
        if hits is not None:
            if isinstance(hits, torch.Tensor):
                hits = hits.detach() if hits.requires_grad else hits  # a count has none (recipe.loss): no op
            else:
                hits = float(hits)  # type: ignore[arg-type]
            self.hits = hits if isinstance(self.hits, float) and self.hits == 0.0 else self.hits + hits

    def deferred(self) -> Deferred:
        """[weighted loss sum, hits] on their way to the host (one stack, one copy); on the CPU
        they are host values already, read as they are a step later."""
        assert self.loss is not None
        if self.loss.device.type == "cpu":
            return Deferred.on_host(self.loss, self.hits)
        hits = self.hits if isinstance(self.hits, torch.Tensor) else torch.tensor(self.hits, device=self.loss.device)
        values = torch.stack([self.loss, hits])  # promotes an integer count: one kernel
        return Deferred(values if values.dtype is torch.float32 else values.float())


@dataclasses.dataclass(frozen=True, slots=True)
class PendingOutcome:
    """A computed step whose loss and hits have not been read yet."""

    outcome: StepOutcome  # everything but loss_sum and correct, known on the host
    values: Deferred  # [weighted loss sum, hits]

    def ready(self) -> bool:
        return self.values.ready()

    def complete(self) -> StepOutcome:
        """The outcome with its loss and hits (read a step late: complete by then, or waits for it)."""
        weighted, hits = self.values.values()
        o = self.outcome  # built field by field: ``dataclasses.replace`` costs twice as much, every step
        return StepOutcome(o.step, weighted * o.global_batch, hits, o.count, o.throughput, o.global_batch, o.lr, o.t0, o.cpu0, o.group_lrs, o.eval_clock)
