"""flows.recording."""
