"""The embedded demo: the runner that launches ``workloads``' model-shaped traffic through the real dispatcher."""
