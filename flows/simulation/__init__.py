"""What ``malleable simulate`` runs: policy variants over a workload, their summary and its rerun."""
