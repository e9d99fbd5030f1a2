"""elastic_tasks.profiling."""
