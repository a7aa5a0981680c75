"""Training inside the kernel: ``fit``, its data, devices, precision, XLA and ``launch``.

May import ``machine``, ``checkpoint`` and the shared helpers.
"""
