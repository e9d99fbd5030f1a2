"""service.jobs: what a submitted job may be — its checks, its profile when it brings none, the entry points it may name."""
