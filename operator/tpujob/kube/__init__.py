"""The only code that talks to the Kubernetes API (through the official client).

`observe` reads one job's world into `tpujob.observed.views.Observed`; `apply` carries out a `Plan`
idempotently; `errors` turns client exceptions into typed errors that carry the reason.
"""
