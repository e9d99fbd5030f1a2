"""Every benchmark script, what it needs, its sizes and its headline figures with their targets.

One entry per script under ``benchmarks/`` that prints one JSON object as its last line;
helper modules and data generators are in ``EXCLUDED`` with the reason (tests check that the
two lists cover every script). ``quick`` is the script's small sizes: the whole ``--quick``
run must fit in 10 minutes on the 2-core dev box, so a benchmark whose figure means nothing
at a small size has ``quick=None`` and says why in ``quick_skip``. Targets are the project's
own (docs/benchmarks.md, the issues' "done when" lines), each with where it was stated.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    """A named figure of a benchmark's JSON line; ``key`` may be dotted into nested objects."""

    key: str
    op: str | None = None  # "<=", ">=", "==": how the value must relate to the target
    target: float | str | None = None  # a number, or another figure's key (a relation)
    source: str = ""  # where the project states the target
    noise: str | None = None  # a key holding [low, high], or "low_key,high_key": the run's own spread
    noise_as: str = "same"  # "same": in this figure's units; "ratio_pct": ratios r, the figure is (r - 1) x 100
    note: str = ""

    @property
    def direction(self) -> str | None:
        return {"<=": "lower is better", ">=": "higher is better", "==": "exact"}.get(self.op or "")


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str  # relative to the repository root
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] | None = ()
    quick_skip: str = ""  # why a benchmark has no quick size
    needs: tuple[str, ...] = ()  # "gpu", "postgres", "namespaces", "pollux"
    figures: tuple[Figure, ...] = ()
    timeout_s: float = 1800.0
    quick_timeout_s: float = 240.0
    landing: str = ""  # the script is promised by an open issue and not in every checkout yet
    summary: str = ""


def _f(key: str, op: str | None = None, target: float | str | None = None, source: str = "", **kw: str) -> Figure:
    return Figure(key, op, target, source, **kw)


DOCS = "docs/benchmarks.md"

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "allocator", "benchmarks/allocator_bench.py", quick=("--repeats", "5", "--brute-force", "50"), quick_timeout_s=60,
        summary="seed-000 DP allocator speed, vectorised vs plain loops; optimum vs brute force",
        figures=(
            _f("dp_100x400_ms", "<=", 5, DOCS), _f("dp_1000x10000_ms", "<=", 1000, DOCS), _f("policy_100x400_ms"),
            _f("speedup_vs_python_dp"), _f("goodput_over_elastic_100x400", "<=", 3, "issue 27"),
            _f("goodput_cold_over_elastic_100x400", "<=", 3, "issue 27"), _f("brute_force_mismatches", "==", 0, DOCS),
        ),
    ),
    Benchmark(
        "simulator", "benchmarks/simulator_bench.py", quick=("--quick",), quick_timeout_s=60,
        summary="simulator speed on seed 000's 400-GPU bursty trace (--quick: no event-driven run)",
        figures=(_f("sim_400gpu_480min_bursty_s", "<=", 10, DOCS), _f("events_per_s"), _f("baseline_s"), _f("event_driven_s"), _f("completed_ratio_vs_baseline")),
    ),
    Benchmark(
        "milp", "benchmarks/milp_bench.py", quick=("--events", "3", "--node-events", "1"), quick_timeout_s=90,
        summary="seed 003's idle-node MILP (BFTrainer), count form vs the paper's node form",
        figures=(
            _f("milp_800x30_median_s", "<=", 0.1, DOCS, noise="milp_800x30_max_s"), _f("milp_4000x200_s", "<=", 10, DOCS),
            _f("milp_800x30_node_form_s"), _f("node_vs_count_mismatches", "==", 0, DOCS), _f("bigm_vs_hull_mismatches", "==", 0, DOCS),
        ),
    ),
    Benchmark(
        "profile", "benchmarks/profile_bench.py", quick=("--batches", "8,32", "--repeats", "2", "--allreduce-params", "10000,1000000"),
        quick_timeout_s=120, summary="profiling the ~10M-parameter examples on CPU; allreduce fit with gloo",
        figures=(_f("allreduce_latency_us"), _f("allreduce_ns_per_param"), _f("alexnet_vs_resnet_comm_ratio")),
    ),
    Benchmark(
        "policies", "benchmarks/policies_bench.py", quick=(), quick_timeout_s=120,
        summary="seed 002/004 policies (Elan FIFO/backfill) beside elastic_dp in the simulator",
        figures=(_f("elan_bf_over_fifo_avg_jct"), _f("elan_fifo_over_elastic_dp_avg_jct_seed000"), _f("admission_hook_active", "==", True, DOCS)),
    ),
    Benchmark(
        "hpo", "benchmarks/hpo_bench.py", quick=(), quick_timeout_s=60,
        summary="seed 001 (RubberBand): elastic HPO plans vs the best static cluster (model)",
        figures=(
            _f("cost_ratio_vs_static", "<=", 0.5, DOCS), _f("plan_time_s", "<=", 1, DOCS), _f("plan_time_s_max"),
            _f("deadline_met_fraction", "==", 1.0, DOCS),
        ),
    ),
    Benchmark(
        "faults", "benchmarks/faults_bench.py", quick=("--only", "bad_inputs", "--only", "damaged_state", "--only", "unreachable"),
        quick_timeout_s=150, summary="faults and bad inputs met cleanly, nothing hangs (--quick: the in-process probes)",
        figures=(
            _f("bad_inputs_clean", "==", "bad_inputs_tried", "issue 37"), _f("faults_survived", "==", "faults_injected", DOCS),
            _f("hangs", "==", 0, "issue 37"), _f("seconds_to_exit_after_sigint"), _f("seconds_to_exit_after_double_sigterm", "<=", 10, "issue 28"),
        ),
    ),
    Benchmark(
        "sim_vs_real", "benchmarks/sim_vs_real_bench.py", quick=None,
        quick_skip="a real 3-job run on Dask takes minutes; the target is for jobs >= 2 min each",
        summary="one jobs file through the simulate flow and the real cluster flow",
        figures=(_f("mean_abs_jct_diff_pct", "<=", 15, DOCS, note="jobs >= 2 min; --refit: <= 10"), _f("unaccounted_wall_pct", "<=", 3, DOCS)),
    ),
    Benchmark(
        "rescale", "benchmarks/rescale_bench.py", quick=("--events", "1", "--steady-steps", "10", "--rounds", "2"), quick_timeout_s=360,
        summary="in-place rescale vs checkpoint-restart; elastic trainer's steady overhead (gloo, CPU)",
        figures=(
            _f("inplace_scale_out_s", "<=", 1, DOCS), _f("inplace_scale_in_s", "<=", 1, DOCS), _f("speedup_vs_restart", ">=", 10, DOCS),
            _f("steady_overhead_pct", "<=", 5, "issue 26", noise="steady_ratio_min,steady_ratio_max", noise_as="ratio_pct", note="noise: per-round ratios"),
            _f("steady_cpu_overhead_pct", "<=", 2, "issue 26"), _f("noise_scale_rel_error", "<=", 0.10, "issue 26"),
        ),
    ),
    Benchmark(
        "step_parts", "benchmarks/step_parts_bench.py", quick=("--cycles", "10"), quick_timeout_s=120,
        summary="what each part of the elastic step adds to a plain DDP step (CPU time, paired ratios)",
        figures=(
            _f("L_cpu_overhead_pct", noise="L_ratio_iqr", noise_as="ratio_pct"), _f("R_cpu_overhead_pct", noise="R_ratio_iqr", noise_as="ratio_pct"),
            _f("H_cpu_overhead_pct", noise="H_ratio_iqr", noise_as="ratio_pct"), _f("LRH_cpu_overhead_pct", noise="LRH_ratio_iqr", noise_as="ratio_pct"), _f("plain_cpu_step_ms", noise="plain_cpu_step_ms_min_max"),
        ),
    ),
    Benchmark(
        "goodput", "benchmarks/goodput_bench.py", quick=("--sweep",), quick_timeout_s=120,
        summary="goodput_dp vs elastic_dp vs fixed_batch_dp on goodput physics (simulated)",
        figures=(
            _f("goodput_over_elastic_dp_avg_jct", "<=", 0.65, "issue 27"), _f("goodput_over_fixed_batch_dp_avg_jct", "<=", 0.3, "issue 27"),
            _f("goodput_p95_over_elastic_dp"),
        ),
    ),
    Benchmark(
        "goodput_real", "benchmarks/goodput_real_bench.py", quick=None,
        quick_skip="3 real jobs to a target loss on a 3-worker cluster: minutes, and the ratio is noise at small sizes",
        summary="real CPU cluster: time for 3 jobs to reach a target loss, goodput_dp vs elastic_dp",
        figures=(_f("real_time_to_target_goodput_over_elastic_dp", "<=", 0.8, DOCS),),
    ),
    Benchmark(
        "refit", "benchmarks/refit_bench.py", quick=(), quick_timeout_s=240,
        summary="online throughput refit on a real CPU run: prediction error per generation",
        figures=(_f("wall_s_mean_error_last_half_pct"), _f("cpu_s_mean_error_last_half_pct"), _f("probe_repeat_drift_pct")),
    ),
    Benchmark(
        "service", "benchmarks/service_bench.py", quick=("--latency-jobs", "3", "--submissions", "300"), quick_timeout_s=420,
        summary="scheduler service: submit latency, store throughput, decision time, crash recovery",
        figures=(
            _f("submit_to_running_p50_s", "<=", 1, DOCS, note="plus rank start"), _f("submissions_per_s", ">=", 500, DOCS),
            _f("submissions_per_s_postgres", ">=", 1000, "issue 28"), _f("poll_ms_1000_queued", "<=", 5, "issue 28"),
            _f("poll_ms_10000_queued", "<=", 20, "issue 28"), _f("decision_ratio_goodput_dp_over_elastic_dp_1000_queued", "<=", 3, "issue 27"),
            _f("double_sigterm_exit_s", "<=", 10, "issue 28"), _f("recovery_s", "<=", 5, DOCS, note="plus checkpoint load"),
        ),
    ),
    Benchmark(
        "growth", "benchmarks/growth_bench.py", quick=None,
        quick_skip="job A's generations must each run minutes for the measured-vs-best ratio to mean anything",
        summary="issue 26: a job grows and its measured throughput beats its best before growth",
        figures=(_f("growth_throughput_ratio", ">=", 0.95, "issue 26"),),
    ),
    Benchmark(
        "fairness", "benchmarks/fairness_bench.py", quick=(), quick_timeout_s=120,
        summary="fair shares among teams on a simulated 64-GPU cluster (issue 36)",
        figures=(
            _f("product_max_rho_on_worst", "<=", 1.1, "issue 36"), _f("avg_jct_ratio_worst", "<=", 1.05, "issue 36"),
            _f("deadline_met_on", "==", "seeds", "issue 36"), _f("return_delay_s_on_worst", "<=", "interval_s", "issue 36"),
            _f("seeds_all_targets_met", "==", "seeds", "issue 36"),
        ),
    ),
    Benchmark(
        "cli_startup", "benchmarks/cli_startup_bench.py", quick=("--repeats", "2"), quick_timeout_s=120,
        summary="`malleable --help` with lazy command imports vs eager; `malleable jobs` and the end of a Ctrl-C'd `jobs --watch`",
        figures=(
            _f("help_s"), _f("eager_help_s"), _f("speedup"), _f("help_heavy_modules", "==", 0, DOCS),
            _f("jobs_s"), _f("jobs_cpu_s"), _f("jobs_heavy_modules", "==", 0, DOCS), _f("watch_exit_s", "<=", 2, "issue 39"),
        ),
    ),
    Benchmark(
        "cluster_start", "benchmarks/cluster_start_bench.py", quick=("--repeats", "1"), quick_timeout_s=120,
        summary="the CLI's local cluster to warm: every nanny in one process, workers forked, vs one spawned process per worker",
        figures=(
            _f("grouped_start_s"), _f("grouped_start_cpu_s"), _f("cpu_ratio", note="spawned over grouped, side by side"),
        ),
    ),
    Benchmark(
        "pollux_trace", "benchmarks/pollux_trace_bench.py", full=("--pollux", "adaptdl/simulator", "--workers", "2"), quick=None,
        quick_skip="8 workloads x 160 jobs per policy: tens of minutes", needs=("pollux",),
        summary="Pollux's OSDI'21 workloads replayed, ours over Pollux's published JCTs (issue 38)",
        figures=(
            _f("goodput_dp|mean_over_pollux", "<=", 0.90, "issue 38"), _f("goodput_dp|p95_over_pollux", "<=", 1.0, "issue 38"),
            _f("goodput_dp|makespan_over_pollux", "<=", 1.0, "issue 38"),
        ),
    ),
    Benchmark(
        "gpu_validation", "benchmarks/gpu_validation.py", quick=("--budget", "420"), needs=("gpu",), quick_timeout_s=480,
        summary="the product on a lent GPU: elastic vs plain DDP step, rescales, memory (issue 34.7)",
        figures=(
            _f("verdict", "==", "pass", "issue 34"),
            _f("checks.elastic_vs_ddp.figures.elastic_over_plain", "<=", 1.02, "issue 34"),
        ),
    ),
    Benchmark(
        "control_plane", "benchmarks/control_plane_bench.py", quick=(), landing="issue 33",
        summary="control plane latency at 256-1024 ranks (issue 33)",
        figures=(_f("plan_latency_p99_ms_1024_ranks", "<=", 500, "issue 33"), _f("agreement_ms_per_step_256_ranks", "<=", 5, "issue 33")),
    ),
    Benchmark(
        "step_work", "benchmarks/step_work_bench.py", quick=(), landing="issue 34",
        summary="work per step of the elastic trainer vs plain DDP: host syncs, passes, ops (issue 34)",
        figures=(
            _f("r1_off_cpu_median_ms", "<=", 0.25, "issue 34 (a quiet box)"), _f("r1_off_kernel_ops", "<=", 8, "issue 34"),
            _f("r1_off_host_syncs_elastic", "==", 0, "issue 34"),
        ),
    ),
)

# Scripts under benchmarks/ that are not benchmarks of their own, and why.
EXCLUDED: dict[str, str] = {
    "benchmarks/gpu_checks.py": "gpu_validation's checks (a module it imports)",
    "benchmarks/gpu_product.py": "gpu_validation's product runs (a module it imports)",
    "benchmarks/gpu_step_compare.py": "gpu_validation's product-vs-DDP step comparison (a module it imports)",
    "benchmarks/gpu_step_recipes.py": "recipes timed on the device, for gpu_validation (a module)",
    "benchmarks/service_faults.py": "faults_bench's service probes (a module it imports)",
    "benchmarks/pollux_trace.py": "the Pollux artifact's conversion, for pollux_trace_bench (a module)",
    "benchmarks/goodput_diagnose.py": "measurements that explain goodput_bench's figures, printed as text, no JSON line",
    "benchmarks/measure_noise_scale.py": "writes benchmarks/data/noise_trajectories.json (data for goodput_bench), not a figure",
    "benchmarks/gpu_wheels.sh": "downloads wheels for the GPU machine",
    "benchmarks/step_counters.py": "step_work_bench's counters (a module it imports)",
    "benchmarks/suite_under_burner.py": "the test suite N times beside a CPU burner (issue 39's flake check): a verdict on the tests, not a figure of the product",
}

BY_NAME: dict[str, Benchmark] = {b.name: b for b in BENCHMARKS}


def by_script(script: str) -> Benchmark | None:
    return next((b for b in BENCHMARKS if b.script == script), None)


def figure(bench: str, key: str) -> Figure | None:
    b = BY_NAME.get(bench)
    return None if b is None else next((f for f in b.figures if f.key == key), None)


@dataclass(frozen=True)
class Registry:
    """What the runner sees: the benchmarks and the repository root their scripts are relative to
    (tests build one over a temporary directory)."""

    benchmarks: tuple[Benchmark, ...] = BENCHMARKS
    root: str = ""
    excluded: dict[str, str] = field(default_factory=lambda: dict(EXCLUDED))

    def get(self, name: str) -> Benchmark | None:
        return next((b for b in self.benchmarks if b.name == name), None)
