"""How a job progresses: seed 000's throughput model, goodput with the gradient noise scale, hosts
and allreduce cost, and which physics a run is judged on (``choice.py``).
"""
