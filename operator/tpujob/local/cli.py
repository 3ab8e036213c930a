"""`tpujob local ...`: bring the local cluster up and down, look at it, and break it on purpose."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from tpujob.local import controlplane, faults
from tpujob.local.processes import ComponentError


def register(subparsers: Any) -> None:
    local = subparsers.add_parser("local", help="a real Kubernetes control plane on this machine")
    sub = local.add_subparsers(dest="local_command", required=True, metavar="ACTION")

    def with_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--state-dir",
            type=Path,
            default=controlplane.default_state_dir(),
            help="where the cluster keeps its state (default: %(default)s)",
        )
        return p

    up = with_dir(sub.add_parser("up", help="start the cluster (no-op if it runs)"))
    up.add_argument("--pools", type=int, default=3, help="TPU node pools, one slice each")
    up.add_argument("--accelerator", default="tpu-v5-lite-podslice")
    up.add_argument("--topology", default="4x4")
    up.add_argument(
        "--spare-nodes",
        type=int,
        default=1,
        help="plain CPU nodes for everything that is not a TPU workload",
    )
    up.add_argument(
        "--apiserver-port",
        type=int,
        default=None,
        help="port for kube-apiserver on 127.0.0.1 (default: a free one)",
    )
    up.set_defaults(handler=_up)

    down = with_dir(sub.add_parser("down", help="stop every process the cluster started"))
    down.add_argument("--purge", action="store_true", help="also delete the state dir")
    down.set_defaults(handler=_down)

    with_dir(sub.add_parser("status", help="components and nodes")).set_defaults(handler=_status)

    logs = with_dir(sub.add_parser("logs", help="a pod's container log"))
    logs.add_argument("pod")
    logs.add_argument("-n", "--namespace", default=None)
    logs.add_argument("-c", "--container", default=None)
    logs.set_defaults(handler=_logs)

    fault = sub.add_parser("fault", help="inject a real fault")
    fsub = fault.add_subparsers(dest="fault", required=True, metavar="FAULT")
    kill = with_dir(fsub.add_parser("kill", help="signal a pod's container process"))
    kill.add_argument("pod")
    kill.add_argument("-n", "--namespace", default=None)
    kill.add_argument("--signal", default="KILL", help="signal name (default: KILL)")
    kill.add_argument(
        "--leaf",
        action="store_true",
        help="signal the deepest process under the container's main one (the training "
        "process under a supervisor) instead of the main process",
    )
    kill.set_defaults(handler=_kill)
    for name, text in (
        ("node-down", "stop a node's heartbeats and kill its pods"),
        ("node-up", "bring a node back (ends kubelet-stop and not-ready too)"),
        ("kubelet-stop", "silence a node's kubelet; its containers run on"),
        ("not-ready", "the node's kubelet reports Ready=False; pods run on"),
        ("ready", "the node's kubelet reports Ready=True again"),
        ("tpu-unhealthy", "report the node's TPU chips unhealthy"),
        ("tpu-healthy", "report the node's TPU chips healthy again"),
        ("maintenance", "set GKE's maintenance taint and label"),
    ):
        p = with_dir(fsub.add_parser(name, help=text))
        p.add_argument("node")
        p.set_defaults(handler=_node_fault, fault_name=name)
    for name, text in (
        ("partition", "cut a pod's network; its process lives on"),
        ("heal", "restore a partitioned pod's network"),
    ):
        p = with_dir(fsub.add_parser(name, help=text))
        p.add_argument("pod")
        p.add_argument("-n", "--namespace", default=None)
        p.set_defaults(handler=_partition, heal=name == "heal")


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except ComponentError as err:
            print(f"tpujob local: {err}", file=sys.stderr)
            return 1

    return run


@_guard
def _up(args: argparse.Namespace) -> int:
    pools = controlplane.PoolOptions(args.pools, args.accelerator, args.topology, args.spare_nodes)
    state = controlplane.up(args.state_dir, pools, apiserver_port=args.apiserver_port)
    kubeconfig = Path(state.state_dir) / "kubeconfig"
    print(f"cluster up at {state.server}")
    print(f"  export KUBECONFIG={kubeconfig}")
    print(f"  tpujob local status --state-dir {state.state_dir}")
    return 0


@_guard
def _down(args: argparse.Namespace) -> int:
    stopped = controlplane.down(args.state_dir, purge=args.purge)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    if not args.purge:
        print(f"state kept in {args.state_dir.resolve()} (etcd data, logs); --purge removes it")
    return 0


@_guard
def _status(args: argparse.Namespace) -> int:
    state = controlplane.ClusterState.load(args.state_dir.resolve())
    if state is None or not state.components:
        print(f"no cluster in {args.state_dir}")
        return 1
    print(f"cluster in {state.state_dir} at {state.server}")
    for comp in state.components:
        print(f"  {comp.name:<24} {'running' if comp.alive() else 'DEAD'}  pid {comp.pid}")
    if not all(c.alive() for c in state.components):
        return 1
    from kubernetes import client, config

    core = client.CoreV1Api(
        config.new_client_from_config(str(Path(state.state_dir) / "kubeconfig"))
    )
    print(f"  {'NODE':<22} {'READY':<8} {'TPU':<5} {'POOL':<12} TAINTS")
    for node in core.list_node().items:
        ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "?")
        tpu = (node.status.allocatable or {}).get("google.com/tpu", "-")
        pool = (node.metadata.labels or {}).get("cloud.google.com/gke-nodepool", "")
        taints = ",".join(t.key.split("/")[-1] for t in node.spec.taints or [])
        print(f"  {node.metadata.name:<22} {ready:<8} {tpu:<5} {pool:<12} {taints}")
    return 0


@_guard
def _logs(args: argparse.Namespace) -> int:
    pod = faults.find_pod(args.state_dir.resolve(), args.pod, args.namespace)
    dirs = sorted((pod.directory / "containers").iterdir())
    if args.container:
        dirs = [d for d in dirs if d.name == args.container]
    for directory in dirs:
        logs = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
        if logs:
            sys.stdout.write(logs[-1].read_text(errors="replace"))
    return 0


@_guard
def _kill(args: argparse.Namespace) -> int:
    name = args.signal.upper().removeprefix("SIG")
    try:
        sig = signal.Signals[f"SIG{name}"]
    except KeyError as err:
        raise ComponentError(f"unknown signal {args.signal}") from err
    pod = faults.find_pod(args.state_dir.resolve(), args.pod, args.namespace)
    faults.kill_pod(args.state_dir.resolve(), pod, sig, leaf=args.leaf)
    which = "the deepest process of " if args.leaf else ""
    print(f"sent SIG{name} to {which}{pod.namespace}/{pod.name}")
    return 0


@_guard
def _node_fault(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    if args.fault_name == "maintenance":
        faults.maintenance(state_dir, args.node)
    else:
        changes = {
            "node-down": {"down": True},
            "node-up": {"down": False, "kubelet_stopped": False, "not_ready": False},
            "kubelet-stop": {"kubelet_stopped": True},
            "not-ready": {"not_ready": True},
            "ready": {"not_ready": False},
            "tpu-unhealthy": {"tpu_unhealthy": True},
            "tpu-healthy": {"tpu_unhealthy": False},
        }[args.fault_name]
        faults.set_node_fault(state_dir, args.node, **changes)
    print(f"{args.fault_name}: {args.node}")
    return 0


@_guard
def _partition(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    pod = faults.find_pod(state_dir, args.pod, args.namespace)
    faults.partition_pod(state_dir, pod, heal=args.heal)
    print(f"{'healed' if args.heal else 'partitioned'} {pod.namespace}/{pod.name}")
    return 0
