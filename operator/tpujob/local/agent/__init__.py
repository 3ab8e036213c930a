"""The local cluster's node agent: fake GKE TPU nodes whose pods are real local processes.

One agent process serves every node of a cluster, as a kubelet per node would: it registers the
nodes, renews their Leases, posts their status, runs the pods bound to them (each in its own
network namespace and mount namespace), reports pod status as a kubelet does, and applies the
faults `tpujob local fault` asks for.
"""
