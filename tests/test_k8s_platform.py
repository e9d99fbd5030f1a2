"""What a platform review asks of the Kubernetes deployment (issue 23 item 5, issue 22 item 4),
checked offline on every manifest of deploy/k8s and on the DaskCluster the committed settings
generate: requests, limits and probes everywhere, read-only root filesystems, no committed
secret and no password on a command line, pinned and qualified images, a default-deny network
policy, shared checkpoint storage in every pod, GPU pods that hold a node sized per GPU."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from deploy.clusters import K8S_GPU, KubeSpec, kube_cluster_spec
from tests.test_k8s_validation import MANIFESTS, ROOT, _dask_resources, _docs, _pods

pytest.importorskip("kubernetes_validate", reason="the test extra: pip install -e '.[test]'")


def _all_docs() -> list[dict]:
    return [d for m in MANIFESTS for d in _docs(m)]


# -- what a platform review asks of the deployment (issue 23 item 5, issue 22 item 4) ------------

# The settings every malleable pod reads (deploy/k8s/settings.yaml), as the pods see them.
SETTINGS = next(d for d in _docs(ROOT / "deploy" / "k8s" / "settings.yaml") if d["kind"] == "ConfigMap")["data"]


def _team_cluster(monkeypatch, gpus: int = 16) -> dict:
    """The DaskCluster the service or a flow starts under the committed settings."""
    from flows.config.kube import kube_spec
    from flows.config.settings import load_settings

    for key, value in SETTINGS.items():
        monkeypatch.setenv(key, value)
    return kube_cluster_spec(kube_spec(load_settings(), gpus))


def _every_pod(monkeypatch) -> list[tuple[str, dict]]:
    """(name, PodSpec) of every manifest workload and of the generated scheduler and worker pods."""
    pods = [(d["metadata"]["name"], pod) for d in _all_docs() for pod in _pods(d)]
    cluster = _team_cluster(monkeypatch)
    pods += [(r["metadata"]["name"], r["spec"]) for r in _dask_resources(cluster) if r["kind"] == "Pod"]
    return pods


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)


def container_violations(name: str, pod: dict) -> list[str]:
    """Requests and a memory limit (a ResourceQuota rejects pods without them), a liveness probe,
    a readiness probe where a port is served, a read-only root filesystem with /tmp writable."""
    out = []
    mounted = {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts") or []}
    if "/tmp" not in mounted:
        out.append(f"{name}: no writable /tmp")
    for c in pod["containers"]:
        where = f"{name}/{c['name']}"
        res = c.get("resources") or {}
        if not {"cpu", "memory"} <= set(res.get("requests") or {}):
            out.append(f"{where}: cpu and memory requests")
        if "memory" not in (res.get("limits") or {}):
            out.append(f"{where}: memory limit")
        if not c.get("livenessProbe"):
            out.append(f"{where}: livenessProbe")
        if c.get("ports") and not c.get("readinessProbe"):
            out.append(f"{where}: serves a port without a readinessProbe")
        if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
            out.append(f"{where}: readOnlyRootFilesystem")
    return out


def rwo_rollout_violations(docs: list[dict]) -> list[str]:
    """A Deployment whose pod mounts a ReadWriteOnce claim must be recreated, not rolled (a new pod
    on another node cannot mount the volume the old one holds, and the rollout stalls)."""
    claims = {d["metadata"]["name"]: d["spec"]["accessModes"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    out = []
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        used = [v["persistentVolumeClaim"]["claimName"] for v in d["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v]
        if any("ReadWriteOnce" in claims.get(c, ()) for c in used) and d["spec"].get("strategy", {}).get("type") != "Recreate":
            out.append(d["metadata"]["name"])
    return out


_CREDENTIAL_URL = re.compile(r"://[^/\s:@]*:[^/\s@]*@")


def secret_violations(docs: list[dict]) -> list[str]:
    """No Secret committed; a credential reaches a container only through env from a Secret
    (composed from Secret-fed variables at most), never through its command line."""
    out = [f"Secret {d['metadata']['name']} committed" for d in docs if d["kind"] == "Secret"]
    for doc in docs:
        for pod in _pods(doc):
            for c in pod["containers"]:
                line = " ".join([*c.get("command", []), *c.get("args", [])])
                if "PASSWORD" in line.upper() or _CREDENTIAL_URL.search(line):
                    out.append(f"{c['name']}: a credential on the command line: {line}")
                for env in c.get("env") or []:
                    if any(k in env["name"] for k in ("PASSWORD", "JOB_STORE", "TOKEN", "SECRET")) and "secretKeyRef" not in env.get("valueFrom", {}):
                        out.append(f"{c['name']}: {env['name']} not from a Secret")
                    value = env.get("value", "")
                    if _CREDENTIAL_URL.search(value) and "$(" not in value.split("@")[0]:
                        out.append(f"{c['name']}: {env['name']} carries a literal credential")
    return out


def test_every_container_has_requests_limits_probes_and_a_read_only_root(monkeypatch):
    pods = _every_pod(monkeypatch)
    assert len(pods) >= 6 and [v for name, pod in pods for v in container_violations(name, pod)] == []


def test_a_deployment_on_a_read_write_once_volume_is_recreated_not_rolled():
    assert rwo_rollout_violations(_all_docs()) == []
    assert any(d["spec"].get("strategy", {}).get("type") == "Recreate" for d in _all_docs() if d["kind"] == "Deployment")


def test_the_platform_rules_catch_what_they_claim():
    """Each rule rejects a manifest that breaks it (the shapes issue 23 found in review)."""
    docs = [d for d in yaml.safe_load_all(yaml.safe_dump_all(_all_docs())) if d]
    mlflow = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    pod = mlflow["spec"]["template"]["spec"]
    container = pod["containers"][0]
    del mlflow["spec"]["strategy"]
    del container["resources"]["requests"]
    del container["livenessProbe"]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["args"] = ["--backend-store-uri", "postgresql://$(POSTGRES_USER):$(POSTGRES_PASSWORD)@mlflow-db:5432/mlflow"]
    container["env"].append({"name": "MALLEABLE_JOB_STORE", "value": "postgresql+psycopg://u:hunter2@db/x"})
    docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mlflow-db"}, "stringData": {"POSTGRES_PASSWORD": "change-me"}})
    assert rwo_rollout_violations(docs) == ["mlflow"]
    found = " ".join(container_violations("mlflow", pod))
    assert "requests" in found and "livenessProbe" in found and "readOnlyRootFilesystem" in found
    found = " ".join(secret_violations(docs))
    assert "Secret mlflow-db committed" in found and "command line" in found
    assert "MALLEABLE_JOB_STORE not from a Secret" in found and "literal credential" in found


def _image_ok(image: str) -> bool:
    """Registry-qualified, and pinned: a digest, or a tag with a version beyond the major."""
    name, _, digest = image.partition("@")
    registry = name.split("/", 1)[0]
    qualified = "/" in name and ("." in registry or ":" in registry or registry == "localhost")
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    pinned = digest.startswith("sha256:") or (tag not in ("", "latest") and any(ch.isdigit() for ch in tag) and "." in tag)
    return qualified and pinned


def test_images_are_qualified_and_pinned(monkeypatch):
    images = [c["image"] for _, pod in _every_pod(monkeypatch) for c in pod["containers"]]
    images += [SETTINGS["MALLEABLE_KUBE_IMAGE"], SETTINGS["MALLEABLE_KUBE_GPU_IMAGE"]]
    assert images and [i for i in images if not _image_ok(i)] == []
    assert not _image_ok("postgres:16") and not _image_ok("malleable:0.1.0") and not _image_ok("docker.io/library/postgres:16")
    assert _image_ok("docker.io/library/postgres:16.10-bookworm") and _image_ok("reg.io/m/x@sha256:" + "0" * 64)


def test_no_secret_value_is_committed_and_passwords_never_reach_a_command_line():
    text = "\n".join(m.read_text() for m in (ROOT / "deploy" / "k8s").glob("*.yaml"))
    assert "change-me" not in text
    assert secret_violations(_all_docs()) == []


def test_a_network_policy_denies_by_default_and_guards_the_database():
    policies = {d["metadata"]["name"]: d["spec"] for d in _all_docs() if d["kind"] == "NetworkPolicy"}
    deny = [p for p in policies.values() if p["podSelector"] == {} and "Ingress" in p["policyTypes"] and not p.get("ingress")]
    assert deny, "no default-deny ingress policy"
    db = [p for p in policies.values() if p["podSelector"].get("matchLabels") == {"app": "mlflow-db"}]
    assert len(db) == 1 and [f["podSelector"] for r in db[0]["ingress"] for f in r["from"]] == [{"matchLabels": {"app": "mlflow"}}]
    # Every workload's pods are reachable by some rule or deliberately not (the workers poll out).
    dask = [p for p in policies.values() if any(e.get("key") == "dask.org/cluster-name" for e in p["podSelector"].get("matchExpressions", []))]
    assert dask, "the Dask pods (ranks talk to each other) need an ingress rule under the default deny"


def test_every_malleable_pod_shares_the_checkpoint_volume(monkeypatch):
    """One ReadWriteMany claim, mounted at MALLEABLE_CHECKPOINT_DIR in the Prefect worker, the service
    and every GPU worker pod: a job resumes and is exported from the checkpoints its ranks wrote."""
    claim, path = SETTINGS["MALLEABLE_KUBE_CHECKPOINT_CLAIM"], SETTINGS["MALLEABLE_CHECKPOINT_DIR"]
    pvc = next(d for d in _all_docs() if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    malleable = [d for d in _all_docs() if d["kind"] == "Deployment" and d["metadata"]["name"] in ("prefect-worker", "malleable-service")]
    pods = [d["spec"]["template"]["spec"] for d in malleable] + [_team_cluster(monkeypatch)["spec"]["worker"]["spec"]]
    assert len(pods) == 3
    for pod in pods:
        volume = next(v["name"] for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == claim)
        c = pod["containers"][0]
        assert {"name": volume, "mountPath": path} in c["volumeMounts"]
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        from_settings = any(s.get("configMapRef", {}).get("name") == "malleable-settings" for s in c.get("envFrom") or [])
        assert env.get("MALLEABLE_CHECKPOINT_DIR") == path or from_settings


def test_gpu_pods_hold_a_whole_node_sized_per_gpu_from_the_settings(monkeypatch):
    cluster = _team_cluster(monkeypatch, gpus=12)  # 8-GPU nodes: two pods, 16 GPUs
    per_pod = int(SETTINGS["MALLEABLE_KUBE_GPUS_PER_POD"])
    group = cluster["spec"]["worker"]
    assert group["replicas"] == 2
    pod = group["spec"]
    worker = pod["containers"][0]
    gib = 1024  # Mi per GiB
    for side in ("requests", "limits"):
        res = worker["resources"][side]
        assert res[K8S_GPU] == per_pod
        assert float(res["cpu"]) == per_pod * float(SETTINGS["MALLEABLE_KUBE_CPU_PER_GPU"])
        assert res["memory"] == f"{int(per_pod * float(SETTINGS['MALLEABLE_KUBE_MEMORY_PER_GPU_GIB']) * gib)}Mi"
    # One Dask worker per GPU (dask-cuda), one pod per node.
    assert worker["args"][:3] == ["dask", "cuda", "worker"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == {"dask.org/cluster-name": cluster["metadata"]["name"], "dask.org/component": "worker"}
    # /dev/shm: memory-backed, sized per GPU, inside the memory limit.
    shm = next(v for v in pod["volumes"] if v["name"] == next(m["name"] for m in worker["volumeMounts"] if m["mountPath"] == "/dev/shm"))
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"] == f"{int(per_pod * float(SETTINGS['MALLEABLE_KUBE_SHM_PER_GPU_GIB']) * gib)}Mi"
    # Images from the settings; the scheduler keeps the CPU build.
    assert worker["image"] == SETTINGS["MALLEABLE_KUBE_GPU_IMAGE"]
    assert cluster["spec"]["scheduler"]["spec"]["containers"][0]["image"] == SETTINGS["MALLEABLE_KUBE_IMAGE"]
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == SETTINGS["MALLEABLE_NCCL_SOCKET_IFNAME"]


def test_the_gpu_image_is_never_suffixed_twice():
    assert KubeSpec(image="reg.io/malleable:0.1.0").gpu_image == "reg.io/malleable:0.1.0-cuda"
    assert KubeSpec(image="reg.io/malleable:0.1.0-cuda").gpu_image == "reg.io/malleable:0.1.0-cuda"
    assert KubeSpec(image="reg.io/m:1", worker_image="reg.io/m-gpu:1").gpu_image == "reg.io/m-gpu:1"


def test_default_settings_give_a_cpu_scheduler_and_a_cuda_worker_image(monkeypatch):
    from flows.config.kube import kube_spec
    from flows.config.settings import load_settings

    for key in [k for k in os.environ if k.startswith("MALLEABLE_KUBE")]:
        monkeypatch.delenv(key)
    spec = kube_spec(load_settings(), 4)
    assert (spec.image, spec.gpu_image) == ("malleable:0.1.0", "malleable:0.1.0-cuda")
    monkeypatch.setenv("MALLEABLE_KUBE_IMAGE", "reg.io/malleable:2.0-cuda")
    assert kube_spec(load_settings(), 4).gpu_image == "reg.io/malleable:2.0-cuda"


def test_a_checkpoint_claim_needs_an_absolute_checkpoint_path(monkeypatch):
    from flows.config.settings import SettingsError, load_settings

    monkeypatch.setenv("MALLEABLE_KUBE_CHECKPOINT_CLAIM", "shared")
    monkeypatch.setenv("MALLEABLE_CHECKPOINT_DIR", "s3://bucket/ckpt")
    with pytest.raises(SettingsError, match="MALLEABLE_CHECKPOINT_DIR"):
        load_settings()


def test_the_service_pods_probe_follows_the_store_lease(tmp_path, monkeypatch, capsys):
    """service.yaml's liveness probe (`python -m flows.lease_probe`): alive while a service on this
    host holds and renews the job store's lease, not once it let go or stopped renewing."""
    from flows.lease_probe import main
    from service.store.lease import Lease
    from service.store import JobStore

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    monkeypatch.setenv("MALLEABLE_JOB_STORE", url)
    store = JobStore(url)
    lease = Lease(store, ttl_s=30.0)
    assert main() == 1 and "held by nobody" in capsys.readouterr().out
    lease.acquire()
    assert main() == 0
    lease.release()
    assert main() == 1
    store.close()
    probe = next(d for d in _all_docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == "malleable-service")
    container = probe["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["exec"]["command"] == ["python", "-m", "flows.lease_probe"]


def test_the_team_service_sets_an_entry_point_allow_list_and_gpu_pods_never_see_the_store(monkeypatch):
    from service.jobs.entrypoints import parse_patterns

    # Issue 35.1: the committed settings limit what a store writer can make the pods import ...
    assert parse_patterns(SETTINGS.get("MALLEABLE_ALLOWED_ENTRYPOINTS")), SETTINGS
    # ... and the store's URL (a password) reaches no pod the service starts: neither a value
    # in their environment nor the Secret that holds it.
    monkeypatch.setenv("MALLEABLE_JOB_STORE", "postgresql+psycopg://svc:hunter2@db/x")
    cluster = _team_cluster(monkeypatch)
    text = yaml.safe_dump(cluster)
    assert "hunter2" not in text and "MALLEABLE_JOB_STORE" not in text and "malleable-job-store" not in text


# -- issue 35.6: what a platform engineer hit first ---------------------------------------------


def _deployment(name: str) -> dict:
    return next(d for d in _all_docs() if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name)


def test_malleable_containers_keep_the_images_tini_entrypoint():
    """`command:` would replace the image's ENTRYPOINT (tini): PID 1 would be Python, which
    neither reaps zombies nor (for prefect's worker) forwards SIGTERM to its flow runs."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["tini", "--"\]', dockerfile, re.M)
    ours = [c for d in _all_docs() for pod in _pods(d) for c in pod["containers"] if "registry.example.com/malleable/" in c["image"]]
    assert len(ours) == 3
    assert [c["name"] for c in ours if "command" in c or not c.get("args")] == []


def test_the_prefect_worker_has_time_to_stop_and_the_lease_probe_time_to_answer():
    worker = _deployment("prefect-worker")["spec"]["template"]["spec"]
    service = _deployment("malleable-service")["spec"]["template"]["spec"]
    assert worker.get("terminationGracePeriodSeconds", 30) >= service["terminationGracePeriodSeconds"]
    for probe in ("startupProbe", "livenessProbe"):
        # the lease probe took 1.6-1.9 s (a Python start); Kubernetes' default timeout is 1 s
        assert service["containers"][0][probe].get("timeoutSeconds", 1) >= 5, probe


def test_the_prefect_server_is_reachable_under_the_default_deny():
    policies = [d["spec"] for d in _all_docs() if d["kind"] == "NetworkPolicy"]
    worker = _deployment("prefect-worker")["spec"]["template"]["spec"]["containers"][0]
    api = next(e["value"] for e in worker["env"] if e["name"] == "PREFECT_API_URL")
    port = int(api.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    rules = [p for p in policies if "prefect-server" in str(p["podSelector"])]
    assert rules and any(port in [q["port"] for q in r.get("ports", [])] and {"podSelector": {}} in r["from"] for p in rules for r in p["ingress"])


def test_every_claim_names_its_storage_class():
    claims = [d for d in _all_docs() if d["kind"] == "PersistentVolumeClaim"]
    assert claims and [d["metadata"]["name"] for d in claims if not d["spec"].get("storageClassName")] == []


def test_set_image_reaches_the_images_the_service_hands_the_dask_operator():
    config = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomizeconfig.yaml").read_text())
    kustomization = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    assert "kustomizeconfig.yaml" in kustomization["configurations"]
    paths = {(f["kind"], f["path"]) for f in config["images"]}
    assert {("ConfigMap", "data/MALLEABLE_KUBE_IMAGE"), ("ConfigMap", "data/MALLEABLE_KUBE_GPU_IMAGE")} <= paths
    # The CPU and CUDA builds differ in repository name, so one `set image` each (digests differ).
    repository = lambda image: image.split("@")[0].rsplit(":", 1)[0]  # noqa: E731
    assert repository(SETTINGS["MALLEABLE_KUBE_IMAGE"]) != repository(SETTINGS["MALLEABLE_KUBE_GPU_IMAGE"])
    assert SETTINGS["MALLEABLE_KUBE_IMAGE"] == _deployment("malleable-service")["spec"]["template"]["spec"]["containers"][0]["image"]


def test_gpu_workers_and_the_database_have_disruption_budgets():
    budgets = [d["spec"] for d in _all_docs() if d["kind"] == "PodDisruptionBudget"]
    selected = [b["selector"]["matchLabels"] for b in budgets]
    assert {"dask.org/component": "worker"} in selected and {"app": "mlflow-db"} in selected
    assert all(b.get("maxUnavailable") == 1 for b in budgets)


def test_the_service_journal_lives_in_the_state_directory(tmp_path):
    from service.tracking.service_runs import service_journal

    state = SETTINGS["MALLEABLE_STATE_DIR"]
    mounts = {m["mountPath"] for m in _deployment("malleable-service")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    claim_mount = next(m for m in mounts if state.startswith(m))  # the state directory is on a mounted claim
    assert claim_mount != "/tmp"
    journal = service_journal("postgresql+psycopg://svc@db/x", state)
    assert str(journal).startswith(state + "/")
