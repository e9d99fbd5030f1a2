"""Kubernetes material checked offline: every manifest of deploy/k8s and the DaskCluster spec we
generate against Kubernetes' own OpenAPI schemas (kubernetes-validate ships them), and every pod
against the *restricted* Pod Security Standard, whose rules are written out here
(https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.clusters import KubeSpec, kube_cluster_spec

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.33"  # a supported release; the schemas come with the package, no network
# Kubernetes objects; kustomization.yaml is kustomize's own file (checked for what it lists below).
MANIFESTS = sorted(p for p in (ROOT / "deploy" / "k8s").glob("*.yaml") if p.name not in ("kustomization.yaml", "kustomizeconfig.yaml"))

# Restricted profile: volume types allowed, capabilities that may be added, seccomp types.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}


def restricted_violations(pod: dict) -> list[str]:
    """What in a PodSpec the restricted Pod Security Standard (and the baseline it builds on) forbids."""
    out: list[str] = []
    pod_sc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"pod.{key}")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {volume['name']}: {sorted(kinds - ALLOWED_VOLUMES)}")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod.securityContext.runAsUser=0")
    if pod_sc.get("seccompProfile", {}).get("type") not in (None, *ALLOWED_SECCOMP):
        out.append(f"pod seccompProfile {pod_sc['seccompProfile']}")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities.drop must include ALL")
        if not set(caps.get("add") or []) <= ALLOWED_ADDED_CAPABILITIES:
            out.append(f"{name}: capabilities.add {caps['add']}")
        if not (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True):
            out.append(f"{name}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser=0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ALLOWED_SECCOMP:
            out.append(f"{name}: seccompProfile.type={seccomp!r} (RuntimeDefault or Localhost, pod or container)")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name}: hostPort")
    return out


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _dask_resources(cluster: dict) -> list[dict]:
    """The DaskCluster's embedded Kubernetes objects (a custom resource has no schema here; what
    it carries are a scheduler Pod and Service and worker Pods, so those are checked as such)."""
    name = cluster["metadata"]["name"]
    scheduler, worker = cluster["spec"]["scheduler"], cluster["spec"]["worker"]
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-scheduler"}, "spec": scheduler["spec"]},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-scheduler"}, "spec": scheduler["service"]},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-worker"}, "spec": worker["spec"]},
    ]


def _pods(doc: dict) -> list[dict]:
    if doc["kind"] == "Pod":
        return [doc["spec"]]
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [doc["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_manifests_match_the_kubernetes_schemas(manifest):
    for doc in _docs(manifest):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError, naming the field


# The manifests that run pods (the others hold settings, claims and policies).
WORKLOAD_MANIFESTS = [m for m in MANIFESTS if m.name not in ("settings.yaml", "storage.yaml", "network-policy.yaml", "disruption.yaml")]


@pytest.mark.parametrize("manifest", WORKLOAD_MANIFESTS, ids=lambda p: p.name)
def test_manifest_pods_meet_the_restricted_pod_security_standard(manifest):
    pods = [pod for doc in _docs(manifest) for pod in _pods(doc)]
    assert pods
    for pod in pods:
        assert restricted_violations(pod) == []


def test_generated_dask_cluster_matches_the_schemas_and_the_restricted_standard():
    cluster = kube_cluster_spec(KubeSpec(name="train", namespace="ml", workers=2, env={"MALLEABLE_TRACKING_URI": "http://mlflow:5000"}))
    for resource in _dask_resources(cluster):
        kubernetes_validate.validate(resource, K8S_VERSION, strict=True)
        for pod in _pods(resource):
            assert restricted_violations(pod) == [], resource["metadata"]["name"]


def test_the_checks_catch_what_they_claim():
    """The schema check and the standard's rules each reject a spec that breaks them."""
    cluster = kube_cluster_spec(KubeSpec(name="train"))
    pod = _dask_resources(cluster)[2]
    broken = yaml.safe_load(yaml.safe_dump(pod))
    broken["spec"]["containers"][0]["resources"]["limits"]["cpu"] = {"cores": 4}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    unsafe = yaml.safe_load(yaml.safe_dump(pod["spec"]))
    del unsafe["securityContext"]["seccompProfile"]
    del unsafe["containers"][0]["securityContext"]["seccompProfile"]
    unsafe["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    unsafe["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    found = " ".join(restricted_violations(unsafe))
    assert "seccompProfile" in found and "capabilities.drop" in found and "capabilities.add" in found and "hostPath" in found


def test_dask_cluster_fixes():
    spec = KubeSpec(name="train", image="reg/malleable:1")
    cluster = kube_cluster_spec(spec)
    scheduler = cluster["spec"]["scheduler"]["spec"]["containers"][0]
    assert scheduler["args"][:2] == ["dask", "scheduler"]  # distributed ships no dask-scheduler script
    assert scheduler["resources"]["requests"]["memory"] and scheduler["resources"]["requests"]["cpu"]
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert worker["args"][worker["args"].index("--memory-limit") + 1] == "0"
    assert worker["image"] == "reg/malleable:1-cuda" and scheduler["image"] == "reg/malleable:1"
    names = {spec.unique().name for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("train-") for n in names)
    KubeSpec(name=spec.unique().name)  # still a valid DNS label


def test_mlflow_server_answers_in_cluster_host_names():
    server = next(d for d in _docs(ROOT / "deploy" / "k8s" / "mlflow.yaml") if d["kind"] == "Deployment")
    args = " ".join(server["spec"]["template"]["spec"]["containers"][0]["args"])
    allowed = args.split("--allowed-hosts", 1)[1].split()[0].strip('"').split(",")
    assert "mlflow.malleable.svc:5000" in allowed and "mlflow:5000" in allowed


def test_prefect_worker_has_a_health_check():
    worker = next(d for d in _docs(ROOT / "deploy" / "k8s" / "prefect-worker.yaml") if d["kind"] == "Deployment")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert "--with-healthcheck" in container["args"]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/health" and ports[probe["port"]] == 8080  # Prefect's worker webserver port
