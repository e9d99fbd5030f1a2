"""flows.config."""
