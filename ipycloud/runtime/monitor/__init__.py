"""What the machine is doing: probe, sampler, readings, per-cell use, usage report, prices.

May import ``machine`` and the shared helpers; never ``train`` or ``guard``.
"""
