"""Google Cloud's TPU zone catalogue: which TPU shapes each zone offers (optional, `tpujob[gcp]`).

`catalogue` is pure (the label-to-catalogue table, the checks and the advice); `client` is the
only module that imports `google-cloud-tpu`, and only when a project and zones are configured.
The catalogue never blocks admission and never changes a failure's grade: it lists Cloud TPU
types, not GKE machine-type availability, and newer generations are missing from it.
"""
