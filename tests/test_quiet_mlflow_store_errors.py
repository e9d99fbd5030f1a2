"""A tracking store that goes away prints one line of ours, not MLflow's ERROR and traceback."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap


def test_cli_quiets_mlflow_db_errors_that_our_tracking_reports_itself(tmp_path):
    # A real MLflow sqlite store whose directory is replaced by a file mid-run (what the
    # replay tests do): MLflow's db utils log the SQLAlchemy error at ERROR with a traceback.
    script = textwrap.dedent(
        f"""
        import logging, shutil, sys
        from pathlib import Path
        from flows.commands.shared.console import quiet_libraries
        quiet_libraries()
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        from mlflow import MlflowClient
        store = Path({str(tmp_path)!r}) / "mlruns"
        store.mkdir()
        client = MlflowClient(tracking_uri=f"sqlite:///{{store}}/mlflow.db")
        exp = client.create_experiment("x")
        run = client.create_run(exp)
        shutil.rmtree(store)
        store.write_text("not a directory")
        try:
            client.log_metric(run.info.run_id, "loss", 1.0)
        except Exception as exc:
            print("caught", type(exc).__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "caught" in out.stdout, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "ERROR" not in out.stderr, out.stderr[-2000:]


def test_verbose_keeps_mlflow_db_errors():
    from flows.commands.shared.console import MLFLOW_DB_LOGGER, quiet_libraries

    before = logging.getLogger(MLFLOW_DB_LOGGER).level
    try:
        quiet_libraries(verbose=True)
        assert logging.getLogger(MLFLOW_DB_LOGGER).getEffectiveLevel() <= logging.ERROR
        quiet_libraries(verbose=False)
        assert logging.getLogger(MLFLOW_DB_LOGGER).getEffectiveLevel() > logging.ERROR
    finally:
        logging.getLogger(MLFLOW_DB_LOGGER).setLevel(before)
