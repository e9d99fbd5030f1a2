"""A step whose agreement fails with its group (the peer died) still gets a record: the agreed
one where the allreduce completed, else one over the survivor's own samples, said so.

Two real gloo processes. Both agree on step 0 (read when step 1's agreement is issued); the
peer dies before step 1's agreement; the survivor salvages step 1.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from elastic_tasks.rank.agreement import Agreement, StepOutcome
from tests.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


def _outcome(step: int, rank: int) -> StepOutcome:
    # Rank r's 4 samples have losses summing to 2 * (r + 1) * (step + 1); 3 of them correct.
    return StepOutcome(step, 2.0 * (rank + 1) * (step + 1), 3.0, 4, throughput=400.0, global_batch=8, lr=0.1, t0=time.perf_counter(), cpu0=time.process_time())


def _rank(rank: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    agreement = Agreement(rank, 2)
    assert agreement.issue(_outcome(0, rank), seen_version=1, noise_scale=None) is None
    dist.barrier()  # step 0's agreement has completed on both
    if rank == 1:
        os._exit(0)  # dies before step 1's agreement, as a killed worker does
    time.sleep(1.0)  # let the survivor's gloo pairs see the closed connection
    step0 = agreement.issue(_outcome(1, rank), seen_version=1, noise_scale=None)  # launches step 1's, reads step 0's
    step1 = agreement.salvage(noise_scale=None)
    records = [step0.record, step1.record]
    with open(out_file, "w") as fh:
        json.dump([{"step": r.step, "loss": r.loss, "accuracy": r.accuracy, "loss_samples": r.loss_samples} for r in records], fh)
    os._exit(0)


def test_a_step_whose_agreement_failed_keeps_the_survivors_own_record(tmp_path):
    out = tmp_path / "records.json"
    run_pair(_rank, tmp_path, out)
    by_step = {r["step"]: r for r in json.loads(out.read_text())}
    # Step 0 agreed by both: (2 + 4) / 8 samples, 6 of 8 correct.
    assert by_step[0] == {"step": 0, "loss": 6 / 8, "accuracy": 6 / 8, "loss_samples": None}
    # Step 1 never agreed: rank 0's own 4 samples, loss 2 * 2 / 4, 3 of 4 correct.
    assert by_step[1] == {"step": 1, "loss": 4 / 4, "accuracy": 3 / 4, "loss_samples": 4}
