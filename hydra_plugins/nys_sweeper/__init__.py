"""Hydra finds sweepers only under ``hydra_plugins``: this is nys's default one."""
