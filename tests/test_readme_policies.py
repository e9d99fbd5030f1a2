"""The README's policy list is the registry's: every name it offers to `-p/--policy` builds,
and every registered policy is offered (issue 16, defect 5: it listed `greedy`)."""

import re
from pathlib import Path

from allocator.policies import available_policies

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_policy_list_is_the_registry() -> None:
    text = README.read_text()
    start = text.index("Policies (`-p/--policy`):")
    paragraph = text[start : text.index("(`docs/policies.md`)", start)]
    listed = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert listed == set(available_policies())
