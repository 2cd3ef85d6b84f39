"""`routescope sweep`: microbenchmarks of the attention kernels over rows x top-k, and the gate they imply.

Pure pieces (grid parsing, ratio tables, crossover, gate advice) sit apart from timing and I/O:
``grid`` and ``analysis`` import no torch device state and are tested on their own.
"""
