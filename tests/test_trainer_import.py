"""The worker plugin a service registers (``TrainerImport``) leaves a rank's start nothing heavy to
import: a worker that joins a running job (a host added) gets its new rank ready sooner.

Run in a fresh interpreter: this test process has imported torch's optional parts already.
"""

import json
import subprocess
import sys

PROBE = """
import json, sys
from elastic_tasks.cluster import TrainerImport

TrainerImport().setup(None)
before = set(sys.modules)
from elastic_tasks.recipe import build_optimizer, load_entry_point
recipe = load_entry_point("elastic_tasks.examples.recipes:mlp_tiny")
build_optimizer(recipe, recipe.build_model())
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith("torch"))))
"""


def test_after_the_plugin_a_ranks_first_optimizer_imports_no_torch_module():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # Without the plugin's imports the first optimizer pulls in torch._dynamo (hundreds of modules).
    assert json.loads(done.stdout.splitlines()[-1]) == []


SCHEDULER_PROBE = """
import json, sys, threading
from elastic_tasks.cluster import _import_trainer, _import_trainer_soon

_import_trainer_soon()  # what a service asks of the scheduler first: returns at once
importing = [t.name for t in threading.enumerate() if t.is_alive() and t is not threading.main_thread()]
_import_trainer()  # what it asks last: back only once the import is complete
trainer = sys.modules["elastic_tasks.rank.trainer"]
print(json.dumps({"importing": importing, "complete": callable(getattr(trainer, "run_rank", None))}))
"""


def test_the_scheduler_imports_the_trainer_on_a_thread_and_the_last_call_waits_for_it():
    done = subprocess.run([sys.executable, "-c", SCHEDULER_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    # The scheduler's event loop was not held by the first call: torch takes seconds to import.
    assert seen["importing"] == ["malleable-trainer-import"]
    assert seen["complete"]
