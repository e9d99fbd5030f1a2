"""One training step's work on a rank: micro-batches, backward, optimizer step (the rank loop's ``_step``).

Kept apart from ``trainer.py`` (the loop: generations, agreements, switches) so each stays
small; ``StepWork`` is a mixin of ``trainer._Rank`` and reads the rank's state as it is.
What it leaves for the loop is a ``PendingOutcome``: the step's loss and hits still on the
device, read at the end of the next step (``rank/accounting/pending.py``, issue 34).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

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
    # Runs every step: what does not change between steps is computed once per generation and
    # batch (``_share``), and what a disabled feature would do is not called at all (issue 34:
    # the elastic step's host time within 0.25 ms of a plain DDP loop's).
    _share: tuple[tuple[int, int, int, int], tuple[int, int], list[tuple[int, int]]] | None = None
    _forward_in: object = False  # the forward's autocast context, None for full precision (False: not made yet)

    def _step_share(self: _Rank, batch: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
        """This rank's [lo, hi) of a step of ``batch`` and its micro-batches, for the generation in effect."""
        key = (batch, self.world, self.rank, self.accum)
        share = self._share
        if share is None or share[0] != key:
            lo, hi = rank_slice(batch, self.world, self.rank)
            share = self._share = (key, (lo, hi), micro_batches(hi - lo, self.accum))
        return share[1], share[2]

    def _micro(self: _Rank, ddp: DistributedDataParallel, micro: object, n: int, batch: int, autocast: object, what: str, last: bool) -> tuple[torch.Tensor, object]:
        """One micro-batch of ``n`` samples through DDP, forward (under ``autocast`` unless None) and
        backward: its weighted loss and its hits."""
        with self.witness.step_collectives(what):
            if autocast is None:
                loss, hits = ddp(micro)
            else:
                with autocast:  # type: ignore[attr-defined]
                    loss, hits = ddp(micro)
            if last:
                # Local work ends where the gradient allreduce (waiting for peers) begins.
                self.local_clock.stop()
            # The hook sums over ranks (no extra pass to average): each loss weighs its share.
            weight = loss_weight(n, batch)
            weighted = loss if loss.dtype is torch.float32 else loss.float()
            if weight != 1.0:
                weighted = weighted * weight
            steps.backward(weighted, self.state.scaler)
            if self.config.noise_probe:
                self.noise.after_micro(ddp.module, n, 1.0 / batch, self.world)
        return weighted, hits

    def _step(self: _Rank) -> PendingOutcome:
        t0, cpu0 = time.perf_counter(), time.process_time()
        meta = self.state.meta
        batch = meta.global_batch
        (lo, hi), chunks = self._step_share(batch)
        count = hi - lo  # a step takes exactly ``batch`` positions of the stream (sharding.EpochSampler)
        if self.config.record_indices:
            local = self.sampler.step_indices(meta.samples_seen, batch)[lo:hi]
            self.records.indices.append((meta.step, tuple(int(i) for i in local)))
        lr_factor = lrs.lr_factor(self.recipe, meta.lr.at(meta.step), meta.samples_seen)
        optimizer = self.state.optimizer
        optimizer.zero_grad(set_to_none=True)
        ddp, batches, recipe, scaler = self.ddp, self.batches, self.recipe, self.state.scaler
        assert ddp is not None and batches is not None
        probe, on_host = self.config.noise_probe, self.device.type == "cpu"
        sums = StepSums()  # loss and hits add up on the device, read a step later (rank/accounting/pending.py)
        self.local_clock.start()
        if probe:
            self.noise.begin_step(ddp.module, self.world, len(chunks))
        if self.spec.delay_s:
            time.sleep(self.spec.delay_s)
        forward_in = self._forward_in
        if forward_in is False:  # the rank's first step: its precision and device do not change
            autocast = steps.autocast(recipe.precision, self.device)
            forward_in = self._forward_in = None if autocast is steps.FULL_PRECISION else autocast  # None: no context to enter per micro-batch
        what = f"step {meta.step}"
        *early, (a, b) = chunks
        if early:  # accumulation: all micro-batches but the last without the gradient allreduce
            with ddp.no_sync():
                for a0, b0 in early:
                    micro = next(batches) if on_host else to_device(next(batches), self.device)  # on the host it is there
                    sums.add(*self._micro(ddp, micro, b0 - a0, batch, forward_in, what, last=False))
        micro = next(batches) if on_host else to_device(next(batches), self.device)
        sums.add(*self._micro(ddp, micro, b - a, batch, forward_in, what, last=True))
        if probe:
            # GradScaler's scale as a tensor: the probe divides it out on the device, without reading it.
            self.noise.finish_step(ddp.module, batch, self.world, loss_scale=getattr(scaler, "_scale", None) if scaler is not None else None)
        if lr_factor == 1.0:  # the groups' own LRs: nothing to apply or put back (``scaled_lrs`` would do nothing)
            applied = lrs.group_lrs(optimizer)
            steps.optimizer_step(optimizer, self.state.model, scaler, recipe.clip_grad_norm)
        else:
            with lrs.scaled_lrs(optimizer, lr_factor) as applied:
                steps.optimizer_step(optimizer, self.state.model, scaler, recipe.clip_grad_norm)
        if self.state.scheduler is not None:
            lrs.after_step(self.state.scheduler)
        self.state.meta = meta.stepped(batch)
        throughput = count / max(self.local_clock.seconds(), 1e-9)
        clock = self.evaluation.schedule.clock() if self.rank == 0 else 0.0
        outcome = StepOutcome(meta.step, 0.0, 0.0, count, throughput, batch, applied[0], t0, cpu0, applied, clock)
        return PendingOutcome(outcome, sums.deferred())


