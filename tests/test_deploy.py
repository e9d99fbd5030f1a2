"""deploy/: cluster factories and Kubernetes material, checked offline (no cluster contacted)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from distributed import Client

from deploy.clusters import GPU_RESOURCE, K8S_GPU, KubeSpec, connect, kube_cluster_spec
from deploy.local import TRAINING_WORKER_ENV, local_gpu_cluster
from elastic_tasks.cluster import gpu_workers, warm_up, worker_info

ROOT = Path(__file__).resolve().parents[1]


def test_kubernetes_spec_has_a_gpu_worker_group():
    spec = kube_cluster_spec(KubeSpec(name="train", namespace="ml", image="reg/malleable:1", workers=3, gpus_per_worker=1, env={"MALLEABLE_TRACKING_URI": "http://mlflow:5000"}))
    assert spec["kind"] == "DaskCluster" and spec["apiVersion"].startswith("kubernetes.dask.org/")
    assert spec["metadata"] == {"name": "train", "namespace": "ml"}
    group = spec["spec"]["worker"]
    assert group["replicas"] == 3
    worker = group["spec"]["containers"][0]
    assert worker["image"] == "reg/malleable:1-cuda"  # GPU pods default to the CUDA build
    assert worker["resources"]["limits"][K8S_GPU] == 1 and worker["resources"]["requests"][K8S_GPU] == 1
    args = worker["args"]
    assert args[args.index("--resources") + 1] == f"{GPU_RESOURCE}=1"
    assert args[args.index("--nthreads") + 1] == "1"
    assert {"name": "MALLEABLE_TRACKING_URI", "value": "http://mlflow:5000"} in worker["env"]
    assert {"name": "MALLOC_MMAP_THRESHOLD_", "value": TRAINING_WORKER_ENV["MALLOC_MMAP_THRESHOLD_"]} in worker["env"]
    assert worker["securityContext"]["runAsNonRoot"] is True
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert K8S_GPU not in str(scheduler.get("resources"))  # the scheduler needs no GPU
    assert scheduler["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"name": "Bad_Name"}, "KubeSpec.name"), ({"workers": -1}, "KubeSpec.workers"), ({"gpus_per_worker": 0}, "KubeSpec.gpus_per_worker"), ({"image": ""}, "KubeSpec.image")],
)
def test_kubernetes_spec_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        KubeSpec(**kwargs)


def _containers(doc: dict) -> list[dict]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("containers", [])


@pytest.mark.parametrize("manifest", ["mlflow.yaml", "prefect-worker.yaml"])
def test_manifests_parse_and_run_non_root(manifest):
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / manifest).read_text()) if d]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert workloads
    for doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for c in _containers(doc):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_mlflow_manifest_has_database_backend_and_artifact_store():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "mlflow.yaml").read_text()) if d]
    server = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    # Through the environment (mlflow server reads MLFLOW_*), so no password is on its command line.
    env = {e["name"]: e.get("value") for e in _containers(server)[0]["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert env["MLFLOW_ARTIFACTS_DESTINATION"] == "/artifacts"


def test_prefect_worker_polls_the_process_pool_of_prefect_yaml():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "prefect-worker.yaml").read_text()) if d]
    worker = next(d for d in docs if d["kind"] == "Deployment")
    command = _containers(worker)[0]["args"]
    pool = command[command.index("--pool") + 1]
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert {d["work_pool"]["name"] for d in project["deployments"]} == {pool}


def test_dockerfile_runs_as_non_root():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")


def test_connect_rejects_bad_kinds():
    with pytest.raises(ValueError, match="cluster='mars'"):
        with connect("mars"):
            pass
    with pytest.raises(ValueError, match="scheduler_address"):
        with connect("address", address=None):
            pass


@pytest.mark.slow
def test_local_cluster_has_one_gpu_worker_per_virtual_gpu():
    with connect("local", workers=3) as client:
        workers = gpu_workers(client)
        assert len(workers) == 3
        info = worker_info(client)
        assert all(info[w]["nthreads"] == 1 and info[w]["resources"] == {GPU_RESOURCE: 1} for w in workers)
        # training workers start with glibc's mmap threshold pinned (see elastic_tasks.cluster)
        env = client.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_"))
        assert set(env.values()) == {TRAINING_WORKER_ENV["MALLOC_MMAP_THRESHOLD_"]}
        _assert_quiet_ticks(client)
    assert "DASK_INTERNAL_INHERIT_CONFIG" not in os.environ  # the caller's environment is restored


def _assert_quiet_ticks(client: Client) -> None:
    # Every server of the cluster times its event loop every 0.5 s, not Dask's 20 ms (idle CPU).
    ticks = set(client.run(lambda dask_worker: dask_worker._tick_interval).values())
    ticks |= set(client.run(lambda dask_worker: dask_worker._tick_interval, nanny=True).values())
    ticks.add(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval))
    assert ticks == {0.5}


@pytest.mark.slow
def test_local_gpu_cluster_workers_get_the_training_malloc_setting():
    with local_gpu_cluster(1) as cluster, Client(cluster) as client:
        env = client.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_"))
        assert set(env.values()) == {TRAINING_WORKER_ENV["MALLOC_MMAP_THRESHOLD_"]}
        _assert_quiet_ticks(client)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_warm_up_prepares_the_scheduler_to_unpickle_rank_tasks():
    # The scheduler unpickles each submitted task; without this the first job's start waited
    # while the scheduler imported torch (1.3-1.9 s measured). The subprocess cluster's
    # scheduler is its own process (the LocalCluster fixture's lives in this one).
    # A lambda travels by value: a function of this module would make the scheduler import
    # the module, and with it the trainer.
    trainer_imported = lambda: "elastic_tasks.rank.trainer" in __import__("sys").modules  # noqa: E731
    with connect("local", workers=1) as sub:
        assert not sub.run_on_scheduler(trainer_imported)
        warm_up(sub, "elastic_tasks.examples.recipes:mlp_tiny")
        assert sub.run_on_scheduler(trainer_imported)


def test_a_pod_with_several_gpus_runs_one_worker_per_gpu():
    from deploy.clusters import gpu_worker_args

    one = kube_cluster_spec(KubeSpec(gpus_per_worker=1))["spec"]["worker"]["spec"]["containers"][0]
    four = kube_cluster_spec(KubeSpec(gpus_per_worker=4))["spec"]["worker"]["spec"]["containers"][0]
    assert one["args"][:2] == ["dask", "worker"] and four["args"] == gpu_worker_args(4)
    # dask-cuda starts a worker process per visible GPU; every one advertises a single GPU.
    assert four["args"][:3] == ["dask", "cuda", "worker"]
    assert four["args"][four["args"].index("--resources") + 1] == f"{GPU_RESOURCE}=1"
    assert four["resources"]["limits"][K8S_GPU] == 4


def test_a_host_without_gpu_device_nodes_is_known_cpu_only_without_importing_torch(tmp_path):
    import subprocess
    import sys

    from deploy.local import gpu_device_nodes

    # Which nodes a GPU build of torch needs, by hand: NVIDIA's control node or a numbered GPU, ROCm's kfd.
    for nodes, expected in (((), False), (("nvidia-uvm", "nvidia-modeset"), False), (("nvidiactl",), True), (("nvidia3",), True), (("kfd",), True)):
        dev = tmp_path / "-".join(nodes or ("none",))
        dev.mkdir()
        for name in nodes:
            (dev / name).touch()
        assert gpu_device_nodes(dev) is expected, nodes
    if Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists():
        pytest.skip("this host has GPU device nodes: torch is asked")
    # A fresh process: the CLI's question costs no torch import on a CPU host.
    probe = "import sys; from deploy.local import visible_cuda_devices; print(visible_cuda_devices(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["[]", "False"], done.stdout + done.stderr
