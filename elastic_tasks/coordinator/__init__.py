"""elastic_tasks.coordinator.job."""
