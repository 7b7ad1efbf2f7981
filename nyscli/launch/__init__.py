"""The launcher: from a Typer command's overrides to Hydra's runs, one idea per module.

``faults`` turns faults into one line; ``plan`` composes and checks every job before anything
runs; ``folders`` claims run folders; ``task`` is Hydra's task function (one job); ``run``
drives Hydra (:func:`nyscli.launch.run.launch`); ``sweepers/`` holds the sweepers' logic.
"""
