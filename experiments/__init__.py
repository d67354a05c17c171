"""The reproduction harness's study drivers, beside each study's configs (experiments/<study>/).

A folder with a driver is a package (`study.py`, its variants as YAML beside it); the config-only folders
(async/, colocate/, agent/) are not, and are never imported (`async` is a Python keyword).
launch.py is the one way a study starts a run; cli.py registers `relax study` and `relax bench`.
"""
