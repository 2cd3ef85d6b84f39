"""The embedded demo workload: model-shaped traffic (pure), its scaling, a what-if view, and the runner."""
