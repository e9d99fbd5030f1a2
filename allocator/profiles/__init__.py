"""A workload's speed as measured and as learned: profile types and files, what a running job
measured per configuration, and the online refit of the throughput model from its steps.
"""
