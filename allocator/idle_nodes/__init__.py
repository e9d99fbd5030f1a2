"""Seed 003 (BFTrainer): trainers on the idle nodes of a supercomputer.

``model`` — the per-event problem (nodes, trainers, scaling curves) and its exact objective;
``snapshot_io`` — ClusterSnapshot <-> Problem / Allocation; ``trace`` — idle-node traces
(format, loader, generator); ``replay`` — the event-driven re-solve and U = A_e / A_s.
"""
