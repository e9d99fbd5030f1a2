"""Workloads for the simulator: seed-000 job categories, arrival patterns, trace files."""
