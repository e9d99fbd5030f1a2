"""The long-lived elastic scheduler: a durable job store, the one loop with a wall clock, the Dask executor.

Submitters (the CLI, the Python client, Prefect tasks) write jobs into the store; the service
polls it, runs ``allocator.loop.run_loop`` against the GPU workers alive, and writes every
job's state, allocation history and progress back. The store is the source of truth: a
crash of the service loses nothing, and a restarted service resumes from it.
"""
