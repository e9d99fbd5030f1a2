"""Every runtime setting in one place: ``MALLEABLE_*`` environment variables (or a ``.env``).

Nothing else in the code base reads the environment for its own configuration; flows take a
``Settings`` (or build one with ``load_settings``) and pass plain values down. Defaults need
no server: MLflow on a sqlite file in the state directory, Dask ``LocalCluster``, Prefect's
ephemeral API.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from allocator.overflow import OverflowMode
from service.redaction import redact_url

ENV_PREFIX = "MALLEABLE_"
# scheme:rest with no spaces (sqlite:///…, http(s)://…, postgresql+psycopg://…, file:///…) or databricks
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:\S+|databricks)$")


class ClusterKind(str, Enum):
    LOCAL = "local"
    ADDRESS = "address"
    KUBERNETES = "kubernetes"


class SettingsError(ValueError):
    """A setting has a bad value; the message is one line naming the variable and the value."""


class Settings(BaseSettings):
    # populate_by_name: a CLI flag passes a field by its name even where the field has aliases.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", frozen=True, populate_by_name=True)

    state_dir: Path = Field(Path(".malleable"), description="Where local state lives: MLflow sqlite, checkpoints, profile cache, metric buffer.")
    # MLflow's own variables first, as every MLflow user expects; the project's as the fallback.
    tracking_uri: str | None = Field(
        None,
        validation_alias=AliasChoices("MLFLOW_TRACKING_URI", "MALLEABLE_TRACKING_URI"),
        description="MLflow tracking URI: MLFLOW_TRACKING_URI, else MALLEABLE_TRACKING_URI (default: sqlite:///<state_dir>/mlflow.db).",
    )
    experiment: str = Field(
        "malleable",
        min_length=1,
        validation_alias=AliasChoices("MLFLOW_EXPERIMENT_NAME", "MALLEABLE_EXPERIMENT"),
        description="MLflow experiment name: MLFLOW_EXPERIMENT_NAME, else MALLEABLE_EXPERIMENT.",
    )
    checkpoint_dir: str | None = Field(
        None, description="Checkpoints: a path (a shared volume on a cluster) or an fsspec URL such as s3://bucket/malleable (default: <state_dir>/checkpoints)."
    )
    cluster: ClusterKind = Field(ClusterKind.LOCAL, description="Where Dask workers come from: local, address or kubernetes.")
    scheduler_address: str | None = Field(None, description="Dask scheduler, e.g. tcp://10.0.0.5:8786 (cluster=address).")
    workers: int = Field(4, ge=1, le=4096, description="(Virtual) GPU workers: one Dask worker each, resource GPU=1.")
    policy: str = Field("elastic_dp", description="Allocation policy name.")
    interval_s: float = Field(10.0, gt=0, le=86400, allow_inf_nan=False, description="Δ: seconds between re-allocations.")
    overflow: OverflowMode = Field(OverflowMode.QUEUE, description="Jobs that do not fit: drop or queue.")
    kube_image: str = Field("malleable:0.1.0", min_length=1, description="Container image of the Kubernetes Dask scheduler (the CPU build).")
    kube_gpu_image: str | None = Field(None, min_length=1, description="Container image of the Kubernetes GPU worker pods (default: <kube_image>-cuda, the CUDA build).")
    kube_namespace: str = Field("default", min_length=1, description="Kubernetes namespace.")
    kube_gpus_per_pod: int = Field(8, ge=1, le=64, description="GPUs per Kubernetes worker pod: a node's GPUs, one pod per node, one Dask worker per GPU.")
    kube_cpu_per_gpu: float = Field(8.0, gt=0, le=1024, allow_inf_nan=False, description="CPU cores a worker pod requests per GPU.")
    kube_memory_per_gpu_gib: float = Field(64.0, gt=0, le=16384, allow_inf_nan=False, description="Memory (GiB) a worker pod requests per GPU, /dev/shm included.")
    kube_shm_per_gpu_gib: float = Field(8.0, gt=0, le=16384, allow_inf_nan=False, description="Memory-backed /dev/shm (GiB) per GPU of a worker pod.")
    kube_checkpoint_claim: str | None = Field(
        None, min_length=1, description="A ReadWriteMany PersistentVolumeClaim every worker pod mounts at MALLEABLE_CHECKPOINT_DIR (a path) for shared checkpoints."
    )
    kube_env_secret: str | None = Field(None, min_length=1, description="A Secret whose keys become the worker pods' environment (e.g. object-store credentials).")
    tracking_timeout_s: float = Field(5.0, gt=0, le=3600, allow_inf_nan=False, description="Seconds before an MLflow request counts as unreachable.")
    job_store: str | None = Field(None, description="The scheduler service's job store, any SQLAlchemy URL (default: sqlite:///<state_dir>/jobs.db).")
    react: bool = Field(True, description="The service re-allocates at once on each submission, completion and worker change (else every Δ).")
    service_poll_s: float = Field(0.2, gt=0, le=60, allow_inf_nan=False, description="How often the service looks at the job store for submissions and cancels.")
    allowed_entrypoints: str | None = Field(
        None,
        description="Comma-separated module patterns (fnmatch, e.g. 'elastic_tasks.*,team_models.*') of the entry points the service will run; unset: any.",
    )
    checkpoint_every: int = Field(20, ge=1, le=2**31, description="Service jobs checkpoint every this many steps (what a restart resumes from).")
    teams: Path | None = Field(None, description="The service's teams file (YAML/JSON): each team's GPU quota or weight and members; unset: no fair sharing (docs/service.md, Teams).")
    gloo_socket_ifname: str | None = Field(None, description="Network interface gloo binds and connects on in multi-node jobs (GLOO_SOCKET_IFNAME on the workers), e.g. eth0.")
    nccl_socket_ifname: str | None = Field(None, description="Network interface nccl bootstraps on in multi-node jobs (NCCL_SOCKET_IFNAME on the workers), e.g. eth0 or ib0.")
    prefect_runs: str = Field(
        "auto",
        pattern="^(auto|always|never)$",
        description="Short commands (run --simulate) record a Prefect flow run: auto = where a Prefect API is configured (PREFECT_API_URL), always (starting Prefect's ephemeral API, ~8 s), never.",
    )
    preflight: bool = Field(True, description="`malleable train` runs one step of the recipe on the ranks' device before any worker starts (false: skip it, e.g. a model that builds only where the ranks run).")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        # Settings validate their defaults too, and every CLI command reads them: the default is
        # known good (tests/test_settings.py builds it), so only a chosen policy pays for loading
        # every policy (numpy, pulp) here.
        if value == cls.model_fields["policy"].default:
            return value
        from allocator.policies import UnknownPolicyError, available_policies, parse_policy

        try:
            parse_policy(value).build()
        except UnknownPolicyError:
            raise ValueError(f"unknown policy; choose one of {', '.join(available_policies())}") from None
        return value

    @field_validator("tracking_uri")
    @classmethod
    def _uri_has_scheme(cls, value: str | None) -> str | None:
        # mlflow reads a bare path as a directory store (refused by MLflow 3) and fails deep
        # inside on anything else; say here what a tracking URI looks like.
        if value is not None and not _URI.match(value):
            raise ValueError("not a tracking URI; expected e.g. sqlite:///path/mlflow.db or http://host:5000")
        return value

    @field_validator("state_dir")
    @classmethod
    def _state_dir_not_a_file(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError("is a file; the state directory must be a directory")
        return value

    @model_validator(mode="after")
    def _address_needs_scheduler(self) -> Settings:
        if self.cluster is ClusterKind.ADDRESS and not self.scheduler_address:
            raise ValueError("cluster=address needs MALLEABLE_SCHEDULER_ADDRESS")
        return self

    @model_validator(mode="after")
    def _checkpoint_claim_needs_a_path(self) -> Settings:
        if self.kube_checkpoint_claim and (self.checkpoint_dir is None or not self.checkpoint_dir.startswith("/")):
            raise ValueError(
                f"MALLEABLE_KUBE_CHECKPOINT_CLAIM={self.kube_checkpoint_claim!r} is mounted at MALLEABLE_CHECKPOINT_DIR, "
                f"which must then be an absolute path (got {redact_url(self.checkpoint_dir)!r})"
            )
        if self.kube_shm_per_gpu_gib >= self.kube_memory_per_gpu_gib:
            raise ValueError(
                f"MALLEABLE_KUBE_SHM_PER_GPU_GIB={self.kube_shm_per_gpu_gib!r}: must be below MALLEABLE_KUBE_MEMORY_PER_GPU_GIB="
                f"{self.kube_memory_per_gpu_gib!r} (/dev/shm counts against the pod's memory)"
            )
        return self

    @property
    def resolved_tracking_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{(self.state_dir / 'mlflow.db').resolve()}"

    @property
    def resolved_checkpoint_dir(self) -> Path:
        """The checkpoint directory as a local path (a mounted volume counts); see ``checkpoint_location``."""
        if self.checkpoint_dir is not None and "://" in self.checkpoint_dir:
            raise SettingsError(f"MALLEABLE_CHECKPOINT_DIR={redact_url(self.checkpoint_dir)!r}: this command needs a local or mounted path, not a URL")
        return Path(self.checkpoint_dir) if self.checkpoint_dir is not None else self.state_dir / "checkpoints"

    def checkpoint_location(self, name: str) -> str:
        """Where a run's checkpoints go: ``<checkpoint dir>/<name>``, an absolute path or a URL
        (``s3://…``), so ranks on other machines and the flow resolve it the same way."""
        if self.checkpoint_dir is not None and "://" in self.checkpoint_dir:
            return f"{self.checkpoint_dir.rstrip('/')}/{name}"
        return str(self.resolved_checkpoint_dir.resolve() / name)

    @property
    def buffer_path(self) -> Path:
        """Where tracking calls wait while the MLflow server is unreachable."""
        return self.state_dir / "mlflow-buffer.jsonl"

    @property
    def resolved_job_store(self) -> str:
        if self.job_store:
            return self.job_store
        return f"sqlite:///{(self.state_dir / 'jobs.db').resolve()}"

    @property
    def profile_cache_dir(self) -> Path:
        return self.state_dir / "profiles"

    @property
    def worker_env(self) -> dict[str, str]:
        """Environment the Dask workers that train need from these settings (socket interfaces).

        The same mapping as ``elastic_tasks.devices.socket_env``, kept here so reading settings never imports torch.
        """
        pairs = (("GLOO_SOCKET_IFNAME", self.gloo_socket_ifname), ("NCCL_SOCKET_IFNAME", self.nccl_socket_ifname))
        return {name: value for name, value in pairs if value}


def _one_line(exc: ValidationError, given: set[str]) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ()
    field = str(loc[0]) if loc else ""
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if not field:  # a model-level rule; its message names the variables itself
        return msg
    # A value passed in (a CLI flag) is named as the field; one from the environment as its variable.
    name = field if field in given else _variable(field)
    given_value = err.get("input")
    # A URL setting (a store, the tracking server, checkpoints) may carry a password.
    return f"{name}={redact_url(given_value) if isinstance(given_value, str) else given_value!r}: {msg}"


def _variable(field: str) -> str:
    """The environment variable a failing value came from. A field with aliases (MLflow's own
    variable, then the project's) is reported under its first alias, whichever was set."""
    import os

    for info in Settings.model_fields.values():
        choices = getattr(info.validation_alias, "choices", ())
        if field in choices:
            return next((c for c in choices if isinstance(c, str) and c in os.environ), field)
    return f"{ENV_PREFIX}{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (CLI flags) winning.

    Raises ``SettingsError`` with one line naming the variable and the value.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc, set(given))) from None
    except UnicodeDecodeError as exc:  # python-dotenv reading a .env that is not text
        raise SettingsError(f".env {str(Path('.env').resolve())!r}: not UTF-8 text (byte {exc.start}); fix or remove it") from None
    except OSError as exc:  # e.g. .env is a directory
        raise SettingsError(f".env {str(Path('.env').resolve())!r}: cannot read ({exc.strerror})") from None
