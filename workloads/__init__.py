"""Model-shaped attention traffic, pure (no torch, no clock): the demo runs it and the advice prices it.

``traffic`` holds the served models' shapes and the scheduler simulation that turns a seed into
calls; ``scale`` shrinks the per-row work for a CPU. It sits below ``service`` and ``advise`` and
imports neither, so both can use it without reaching into each other.
"""
