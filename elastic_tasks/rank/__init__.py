"""elastic_tasks.rank."""
