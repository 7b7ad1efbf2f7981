"""``nys report``: ``command`` (tables, CSV and figures from any run folders) and
``sweep_summary`` (the Hydra callback that keeps ``<sweep>/summary.csv`` current)."""
