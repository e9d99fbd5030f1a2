"""Fair shares of one cluster among teams: quotas, borrowing and priority classes, as an outer
layer around any policy (``allocator.fairness.policy``), and how fair a run was (``allocator.fairness.report``).
"""
