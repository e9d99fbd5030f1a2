"""Many hosts on one machine: Linux network namespaces on a bridge (``tests.hosts.netns``)."""
