"""What the operator decides: `plan(observed, now) -> Plan`, the whole reconcile as a pure function.

No I/O and no clock: time comes in as `now`. `planner` is the entry; `result` holds the
`Plan` it returns and the `Draft` it edits on the way. After a failure, `failure` diagnoses
and regrades it (`job_memory`, `node_ledger`, `health_conditions`), `recovery` decides what to
do, and `slices`, `placement`, `pools`, `marks` and `failed_nodes` say where the next attempt
runs and which nodes it avoids. `manifests` and `pod_security` make the child objects as data;
`goodput` and `goodput_breakdown` account for the job's wall time; `rollback` says where a run
resumes after a non-finite loss.
"""

from tpujob.plan.planner import plan
from tpujob.plan.result import Draft, Plan

__all__ = ["Draft", "Plan", "plan"]
