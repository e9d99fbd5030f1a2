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
