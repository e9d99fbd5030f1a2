"""elastic_tasks."""
