"""The shared runtime layer: pure Python, no IPython or widget imports."""
