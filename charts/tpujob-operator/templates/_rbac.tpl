{{- /*
The rules the operator needs where jobs run. `namespaced` is true for a watched namespace's
Role, false for the ClusterRole used when every namespace is watched.
*/}}
{{- define "tpujob-operator.jobNamespaceRules" -}}
# The jobs: watched by kopf (list, watch; reconciles read them from that watch, never a
# get), patched by kopf for its finalizer and annotations, and deleted once
# spec.ttlSecondsAfterFinished has passed.
- apiGroups: ["tpujob.dev"]
  resources: ["tputrainingjobs"]
  verbs: ["list", "watch", "patch", "delete"]
# Phase, steps, restarts, budgets and failures: the operator replaces the status once per
# reconcile (update), kopf merges its own progress into it (patch).
- apiGroups: ["tpujob.dev"]
  resources: ["tputrainingjobs/status"]
  verbs: ["patch", "update"]
# One pod per TPU host, created directly so a gang restarts in place or moves to another node
# pool per attempt; watched by kopf and listed by job label; deleted to restart an attempt and
# force-deleted when stuck on a lost node; patched to move a kept pod to the next attempt
# (its attempt label and rejoin order, a slice restart). Creating a TPUTrainingJob is creating
# these pods.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete", "patch"]
# The last log lines of a failed trainer are evidence for the diagnosis.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# A headless Service per job gives a slice's hosts stable names for JAX's coordinator; it,
# the ServiceAccount, Role and RoleBinding below are owned by the job and removed with it by
# the garbage collector, so the operator never deletes them.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create"]
# Each job's trainer runs as its own ServiceAccount, so it can touch only its own Lease.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
# The per-job Role and RoleBinding granting that ServiceAccount its heartbeat Lease.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
{{- if .namespaced }}
# The trainer's heartbeat Lease: created with the job, read and watched for hang detection,
# patched when an attempt starts. Kubernetes lets a subject put in a Role only rights it holds,
# so the operator also holds the get/update/patch the per-job Role grants the trainer.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update", "patch"]
{{- else }}
# The trainers' heartbeat Leases, read and watched for hang detection. Writing Leases is
# granted per job namespace only (the -leases ClusterRole, which the operator binds to itself
# in a namespace when it first runs a job there), so it never holds Lease writes in
# kube-system or kube-node-lease, where Leases elect leaders and carry node heartbeats.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- if .kueue }}
# Kueue: each queued job's Workload, owned by the job (removed with it by the garbage
# collector): created, watched for Kueue's admission and evictions, patched to deactivate it
# while the job is suspended; its status patched to give the quota back after an eviction and
# to say when every pod runs (PodsReady) and when the job finished.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
# What was diagnosed and what was done, as Events on the job (the operator and kopf both post
# through the core API).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .namespaced }}
# kopf peering between replicas, through the KopfPeering the chart creates in this namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}
