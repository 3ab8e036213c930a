"""What reads the cluster and acts on it: the kopf operator around the pure planner.

`handlers` is the only module with kopf decorators; `reconcile` runs one reconcile of one job
(observe, plan, write the status once, act, tell); `deps` holds what the handlers share;
`wakeups` decides whom an event concerns; `ledger_store` keeps the node ledger; `metrics` the
Prometheus metrics; `main` runs it all (`tpujob operator`).
"""
