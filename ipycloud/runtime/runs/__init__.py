"""Run records: what every run of ``fit`` did, on disk beside its checkpoints, read back as
summaries (status, progress, ETA, best metric) by the Python API, the terminal, the kernel's
page and the Jupyter server."""
