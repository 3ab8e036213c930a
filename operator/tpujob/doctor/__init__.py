"""`tpujob doctor`: is this cluster ready for TPU training jobs, and if not, what to do.

`checks` turns a snapshot of the cluster (raw API objects) into findings and is pure; `cli`
reads the snapshot and prints the findings (or `--json`), exiting non-zero on a problem.
"""
