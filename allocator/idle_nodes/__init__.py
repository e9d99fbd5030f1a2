"""Seed 003 (BFTrainer): trainers on the idle nodes of a supercomputer.

``model`` — the per-event problem (nodes, trainers, scaling curves) and its exact objective;
``milp_model`` — that problem as a PuLP MILP (node and count formulations; the policy in
``allocator/policies/idle_nodes_milp.py`` solves it);
``snapshot_io`` — ClusterSnapshot <-> Problem / Allocation; ``trace`` — idle-node traces
(format, loader, generator); ``replay`` — the event-driven re-solve and U = A_e / A_s.
"""
