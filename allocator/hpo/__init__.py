"""Seed 001 (RubberBand): cost-minimising, deadline-constrained plans for successive-halving HPO.

``spec`` (what the job is), ``parse`` (job-file dicts -> specs), ``placement`` (trial workers
on instances), ``model`` (predicted JCT and cost of a plan), ``planner`` (static baseline,
greedy, exhaustive). Pure: standard library and numpy only.
"""
