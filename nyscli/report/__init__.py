"""Run folders, atomic CSV/JSON writing, environment capture, tables and sweep summaries."""
