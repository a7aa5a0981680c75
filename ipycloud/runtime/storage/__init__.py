"""Data that outlives the session: mounts, verified downloads, safe extraction, Kaggle, Drive,
sync. May import ``machine`` and the shared helpers."""
