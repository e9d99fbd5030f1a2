"""Write the seed-000 category profiles (Table I) from a documented analytical model.

The paper gives no per-batch timings except Table II (category 1 on 2 GPUs), so:

* t_proc(b) = t0 + a * b per iteration on one GPU (fixed overhead + per-sample cost).
* Category 1 (resnet50): Table II tops out at 32 samples per GPU, and its scaling factors
  are relative to one GPU at the largest per-GPU batch, so we take 32 as the memory cap.
  Least-squares fit of t0, a and the 2-GPU allreduce time c to Table II's five factors
  (batch/GPU 8, 11, 16, 22, 32 -> 0.86, 1.06, 1.30, 1.45, 1.66; fitted 0.87, 1.06, 1.28,
  1.46, 1.66) fixes only their ratios t0 : a : c = 0.0366 : 0.00612 : 0.0474; the scale
  comes from c = the ring time for 24M parameters over 10 GbE (0.0769 s), giving
  t0 = 0.0595 s, a = 0.00994 s/sample (~85 samples/s per GPU at 32).
* Memory caps of categories 2-4 are assumptions of the same order (64, 128, 64 per GPU):
  they are what makes large fixed batches need many GPUs — the effect the paper's
  baselines suffer from.
* Categories 2-4 have no published timings. Their per-sample costs are assumptions chosen to
  give each its stated character at the paper's 10 GbE: AlexNet on 32-px CIFAR is cheap per
  sample and heavy in weights (communication bound: with these numbers category 1's best
  scaling factor at its minimum batch is 1.79x category 2's, where Section IV-E reports
  1.3x — a per-sample cost high enough to reach 1.3x would make AlexNet scale better than
  ResNet-50, contradicting Table I, so we kept the character and report the gap),
  VGG11-BN sits between (balanced),
  AlexNet on 224-px Food-101 costs 1.5x more per sample than on CIFAR (it is not elastic,
  so only its run length matters).
* Allreduce: a ring over the paper's 10 GbE (1.25 GB/s), fp32 gradients: 4 / 1.25e9 =
  3.2e-9 s per parameter per link, 50 us per hop.

What matters for the simulator is the *shape* (how throughput scales with batch and GPUs);
job lengths are set in single-GPU minutes, so absolute speeds cancel out.

Run: python examples/profiles/make_seed000_profiles.py   (rewrites seed000_cat*.json beside it)
"""

import json
from pathlib import Path

# category: (workload, params, t0 s, seconds per sample, memory cap per GPU)
MODEL = {
    1: ("resnet50-cifar100", 24_000_000, 0.0595, 0.00994, 32),
    2: ("alexnet-cifar100", 58_000_000, 0.020, 0.0080, 64),
    3: ("vgg11bn-cifar100", 10_000_000, 0.020, 0.0040, 128),
    4: ("alexnet-food101", 58_000_000, 0.020, 0.0120, 64),
}
ALLREDUCE = {"latency_s": 5e-05, "seconds_per_param": 3.2e-09}


def main() -> None:
    here = Path(__file__).parent
    for number, (name, params, t0, per_sample, cap) in MODEL.items():
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= cap]
        profile = {
            "workload": name,
            "hardware": "seed-000 analytical (P100-class, 10 GbE); see make_seed000_profiles.py",
            "num_params": params,
            "batch_sizes": sizes,
            "iter_times_s": [round(t0 + per_sample * b, 6) for b in sizes],
            "max_batch_per_gpu": cap,
            "allreduce": ALLREDUCE,
        }
        (here / f"seed000_cat{number}.json").write_text(json.dumps(profile, indent=2) + "\n")


if __name__ == "__main__":
    main()
