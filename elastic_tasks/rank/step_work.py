"""One training step's work on a rank: micro-batches, backward, optimizer step (the rank loop's ``_step``).

Kept apart from ``trainer.py`` (the loop: generations, agreements, switches) so each stays
small; ``StepWork`` is a mixin of ``trainer._Rank`` and reads the rank's state as it is.
What it leaves for the loop is a ``PendingOutcome``: the step's loss and hits still on the
device, read at the end of the next step (``rank/accounting/pending.py``, issue 34).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING

from elastic_tasks.rank import lr as lrs
from elastic_tasks.rank import step as steps
from elastic_tasks.rank.agreement import StepOutcome
from elastic_tasks.rank.data.sharding import rank_slice
from elastic_tasks.rank.accounting.pending import PendingOutcome, StepSums
from elastic_tasks.rank.scaling import loss_weight, micro_batches
from elastic_tasks.recipe import to_device

if TYPE_CHECKING:
    from elastic_tasks.rank.trainer import _Rank


class StepWork:
    def _step(self: _Rank) -> PendingOutcome:
        t0, cpu0 = time.perf_counter(), time.process_time()
        meta = self.state.meta
        batch = meta.global_batch
        indices = self.sampler.step_indices(meta.samples_seen, batch)
        lo, hi = rank_slice(batch, self.world, self.rank)
        local = indices[lo:hi]
        if self.config.record_indices:
            self.records.indices.append((meta.step, tuple(int(i) for i in local)))
        chunks = micro_batches(len(local), self.accum)
        lr_factor = lrs.lr_factor(self.recipe, meta.lr.at(meta.step), meta.samples_seen)
        self.state.optimizer.zero_grad(set_to_none=True)
        ddp, batches, recipe, scaler = self.ddp, self.batches, self.recipe, self.state.scaler
        assert ddp is not None and batches is not None
        sums = StepSums()  # loss and hits add up on the device, read a step later (rank/accounting/pending.py)
        self.local_clock.start()
        if self.config.noise_probe:
            self.noise.begin_step(ddp.module, self.world, len(chunks))
        if self.spec.delay_s:
            time.sleep(self.spec.delay_s)
        for i, (a, b) in enumerate(chunks):
            micro = to_device(next(batches), self.device)
            last = i == len(chunks) - 1
            with contextlib.nullcontext() if last else ddp.no_sync(), self.witness.step_collectives(f"step {meta.step}"):
                with steps.autocast(recipe.precision, self.device):
                    loss, hits = ddp(micro)
                n = b - a
                if last:
                    # Local work ends where the gradient allreduce (waiting for peers) begins.
                    self.local_clock.stop()
                # The hook sums over ranks (no extra pass to average): each loss weighs its share.
                weight = loss_weight(n, batch)
                weighted = loss.float() * weight if weight != 1.0 else loss.float()
                steps.backward(weighted, scaler)
                self.noise.after_micro(ddp.module, n, 1.0 / batch, self.world)
            sums.add(weighted, hits)
        # GradScaler's scale as a tensor: the probe divides it out on the device, without reading it.
        self.noise.finish_step(ddp.module, batch, self.world, loss_scale=getattr(scaler, "_scale", None) if scaler is not None else None)
        with lrs.scaled_lrs(self.state.optimizer, lr_factor) as applied:
            steps.optimizer_step(self.state.optimizer, self.state.model, scaler, recipe.clip_grad_norm)
        lrs.after_step(self.state.scheduler)
        self.state.meta = dataclasses.replace(meta, step=meta.step + 1, samples_seen=meta.samples_seen + batch)
        throughput = len(local) / max(self.local_clock.seconds(), 1e-9)
        clock = self.evaluation.schedule.clock() if self.rank == 0 else 0.0
        outcome = StepOutcome(meta.step, 0.0, 0.0, len(local), throughput, batch, applied[0], t0, cpu0, applied, clock)
        return PendingOutcome(outcome, sums.deferred())
