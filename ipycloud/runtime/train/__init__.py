"""Training inside the kernel: fit, data loaders, device and precision choice, launch."""
