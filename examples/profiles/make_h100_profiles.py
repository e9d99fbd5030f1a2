"""Write analytical H100 profiles calibrated to ../shared/reference (one real H100, fp32).

Model: t_proc(b) = t0 + b / R. R is chosen so the reference's best samples/s is reached
at the reference's batch; t0 (fixed per-iteration overhead: kernel launches, optimizer
step) is 3 ms for the small-image models and 5 ms for the ImageNet ones — an assumption,
stated here, not a measurement. Allreduce: a ring inside one NVLink node at ~200 GB/s of
bus bandwidth, fp32 gradients (4 bytes/param -> 2e-11 s/param) with 20 us latency per hop —
again an assumption, not a measurement.

Run: python examples/profiles/make_h100_profiles.py   (rewrites the JSON files beside it)
"""

import json
from pathlib import Path

# name: (params, best samples/s, at batch, t0 seconds, memory cap per GPU) — the first
# three from ../shared/reference/README.md; the cap is the largest batch tried there.
REFERENCE = {
    "resnet50-cifar100": (23_700_000, 81_326, 2048, 0.003, 2048),
    "alexnet-cifar100": (57_400_000, 102_755, 2048, 0.003, 2048),
    "vgg11bn-cifar100": (129_000_000, 42_252, 2048, 0.003, 2048),
    "alexnet-food101": (57_400_000, 23_856, 512, 0.005, 512),
}
LADDER = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def main() -> None:
    here = Path(__file__).parent
    for name, (params, best, at, t0, cap) in REFERENCE.items():
        rate = at / (at / best - t0)
        sizes = [b for b in LADDER if b <= cap]
        profile = {
            "workload": name,
            "hardware": "H100-80GB analytical (calibrated to shared/reference)",
            "num_params": params,
            "batch_sizes": sizes,
            "iter_times_s": [round(t0 + b / rate, 7) for b in sizes],
            "max_batch_per_gpu": cap,
            "allreduce": {"latency_s": 2e-05, "seconds_per_param": 2e-11},
        }
        (here / f"h100_{name}.json").write_text(json.dumps(profile, indent=2) + "\n")


if __name__ == "__main__":
    main()
