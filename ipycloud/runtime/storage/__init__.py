"""Storage: persistent folders, verified downloads, safe extraction, incremental sync."""
