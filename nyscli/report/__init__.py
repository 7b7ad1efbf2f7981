"""Run folders, CSV/JSON/text writing (atomic, through ``nyscli.atomic``), environment capture,
the console, tables, learning curves, plots and the paper's reference numbers."""
