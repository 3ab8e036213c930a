"""`tpujob local`: a real Kubernetes control plane and TPU node agent on one machine.

Built for tests, demos and trying tpujob without a cluster: real etcd, kube-apiserver,
kube-scheduler and kube-controller-manager processes, and a node agent that fakes GKE TPU
node pools whose pods run as local processes in their own network and mount namespaces.
"""
