"""The job store's tables (SQLAlchemy Core), the same on sqlite and PostgreSQL.

``SCHEMA_VERSION`` is written into ``malleable_meta`` when a store is created; a store of
another version is refused with a clear error rather than read or written (no silent
corruption). Bump it with any change to these tables, and list the columns a version added in
``ADDED_COLUMNS`` so that ``JobStore`` upgrades an older store in place (new columns are nullable).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text

# 4: the `spec` column holds the job's own record (allocator.specs.spec_to_dict) instead of a
# jobs-file entry. No column changed: rows written before are upgraded as they are read
# (service.jobs.stored.stored_record); the version tells an older malleable, which could not
# read the new rows, to refuse the store rather than fail its jobs.
# 5: `code_version`, the SHA-256 of the entry point's module file a job last started with (issue 35.2).
SCHEMA_VERSION = 5

metadata = MetaData()

meta = Table(
    "malleable_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)

jobs = Table(
    "malleable_jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),  # submission order
    Column("id", String(64), nullable=False, unique=True),
    Column("name", String(255), nullable=False),
    Column("submitter", String(255), nullable=False),
    Column("idempotency_key", String(255), unique=True),
    Column("spec", Text, nullable=False),  # the job as allocator.specs.spec_to_dict writes it (JSON), profile inline
    Column("state", String(16), nullable=False, index=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("cancel_seen", Boolean, nullable=False, default=False),
    Column("submitted_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("updated_at", Float, nullable=False),
    Column("error", Text),
    Column("checkpoint_dir", Text),
    Column("mlflow_run_id", String(64)),
    Column("board_id", String(64)),
    Column("gpus", Integer, nullable=False, default=0),
    Column("batch", Integer, nullable=False, default=0),
    Column("samples_done", Float, nullable=False, default=0.0),
    Column("total_samples", Integer, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    # v2: what a finished job measured (HPO ranks trials by them) and the MLflow run to nest under.
    Column("steps", Integer),
    Column("first_loss", Float),
    Column("final_loss", Float),
    Column("eval_loss", Float),
    Column("mlflow_parent_run_id", String(64)),
    # v3: where a finished job's wall time went (``elastic_tasks.rank.accounting.wall_split.WallSplit`` as JSON).
    Column("wall_split", Text),
    # v5: which code the job ran ("sha256:<hex>" of its entry point's module file, as it started).
    Column("code_version", String(80)),
)
Index("malleable_jobs_cancel", jobs.c.cancel_requested, jobs.c.cancel_seen)

allocations = Table(
    "malleable_allocations",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False, index=True),
    Column("time", Float, nullable=False),  # seconds since the epoch
    Column("gpus", Integer, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    # v3: the generation's samples/s as the model predicted it when decided, and as measured.
    Column("predicted_samples_per_s", Float),
    Column("measured_samples_per_s", Float),
)

# version -> the jobs columns it added (upgrading from version - 1)
ADDED_COLUMNS: dict[int, tuple[str, ...]] = {2: ("steps", "first_loss", "final_loss", "eval_loss", "mlflow_parent_run_id"), 3: ("wall_split",), 5: ("code_version",)}
# version -> the allocations columns it added
ADDED_ALLOCATION_COLUMNS: dict[int, tuple[str, ...]] = {3: ("predicted_samples_per_s", "measured_samples_per_s")}

lease = Table(
    "malleable_lease",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(64)),
    Column("host", String(255)),
    Column("pid", Integer),
    Column("expires_at", Float, nullable=False, default=0.0),
    Column("cluster_address", String(255)),  # the Dask scheduler the holder drives
    Column("cluster_owned", Boolean, nullable=False, default=False),  # started by the holder (embedded)
)
