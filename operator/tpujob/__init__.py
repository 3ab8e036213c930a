"""tpujob: a Kubernetes operator that runs TPU training jobs and keeps them training.

Importing the package has no side effects; the entry points are `tpujob.cli` (the
`tpujob` command) and `tpujob.controller.main` (the kopf operator).
"""

__version__ = "0.1.0"
