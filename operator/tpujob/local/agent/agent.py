"""The node agent's main loop: nodes, heartbeats, the pod watch and pod reconciliation.

Threads: one watches pods (list, then watch, relisting on expiry), one renews node Leases every
second and posts node status every few seconds, and the main thread reconciles every pod bound
to a local node five times a second (start, reap, restart, terminate, report). A node marked
down by `tpujob local fault node-down` behaves like a crashed host: no heartbeats, its pods'
processes killed and their network cut, no status reported and no deletion completed. A node
whose kubelet is stopped (`kubelet-stop`) is silent the same way, but its pods' processes run
on with their network, as after a kubelet crash or a partition of the host from the control
plane; a node marked not-ready posts Ready=False while everything else goes on, as a kubelet
does during a container runtime or PLEG hiccup.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tpujob.local import network
from tpujob.local.agent import nodes as nodeplan
from tpujob.local.agent.lookups import ApiLookups
from tpujob.local.agent.podrunner import PodRunner
from tpujob.local.agent.runtime import (
    PodRuntime,
    Terminated,
    pod_status,
    restart_delay,
    rfc3339,
    tpu_devices,
)
from tpujob.local.agent.sandbox import ApiEndpoint
from tpujob.local.agent.services import ApiForwarder, LogServer
from tpujob.local.controlplane import ClusterState
from tpujob.local.pki import CertificateAuthority

log = logging.getLogger("tpujob.local.agent")
LEASE_SECONDS = 40
STATUS_EVERY = 5.0
API_PORT_IN_PODS = 443
MERGE_PATCH = "application/merge-patch+json"
# The kubelet's floor for a grace period (kuberuntime's minimumGracePeriodInSeconds): what a
# force-deleted pod's containers get between SIGTERM and SIGKILL, and any shorter grace.
MINIMUM_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class NodeFaults:
    down: bool = False
    tpu_unhealthy: bool = False
    not_ready: bool = False  # Ready=False posted; heartbeats and pods go on
    kubelet_stopped: bool = False  # silent to the API, but its containers keep running

    @property
    def silent(self) -> bool:
        """Nothing about the node or its pods reaches the API, and nothing from it is done."""
        return self.down or self.kubelet_stopped


# (connect, read) seconds for every call the agent makes. Without a read timeout a request
# that a restarting apiserver accepted and never answered blocks its thread for good: a pod
# list stuck so leaves every later pod unstarted.
REQUEST_TIMEOUT = (5.0, 60.0)
WATCH_SECONDS = 120


class _TimedApiClient(client.ApiClient):  # type: ignore[misc]
    """An API client whose calls time out unless the caller names a timeout of its own."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT
        return super().call_api(*args, **kwargs)


def timed_client(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return _TimedApiClient(configuration=configuration)


def fault_path(state_dir: Path, node: str) -> Path:
    return state_dir / "faults" / "nodes" / f"{node}.json"


def read_faults(state_dir: Path, node: str) -> NodeFaults:
    try:
        data = json.loads(fault_path(state_dir, node).read_text())
    except (OSError, ValueError):
        return NodeFaults()
    return NodeFaults(**{f.name: bool(data.get(f.name)) for f in dataclasses.fields(NodeFaults)})


class Agent:
    def __init__(self, state_dir: Path) -> None:
        state = ClusterState.load(state_dir)
        if state is None:
            raise SystemExit(f"no cluster state in {state_dir}")
        self.state_dir = state_dir
        self.state = state
        self.nodes = {
            n.name: n
            for n in nodeplan.plan_nodes(
                state.pools.pools,
                state.pools.accelerator,
                state.pools.topology,
                state.pools.spare_nodes,
            )
        }
        self.kubeconfig = str(state_dir / "kubeconfig")
        self.api_client = timed_client(self.kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        self.runtimes: dict[str, PodRuntime] = {}
        self.posted: dict[str, dict[str, Any]] = {}
        self.faults: dict[str, NodeFaults] = {n: NodeFaults() for n in self.nodes}
        self.ready_since = {n: rfc3339(time.time()) for n in self.nodes}
        ca = CertificateAuthority(state_dir / "pki")
        self.ca_path = ca.cert_path
        cert, key = ca.issue(
            "agent-serving",
            "tpujob-local-agent",
            ips=("127.0.0.1",),
            dns_names=("localhost",),
            server=True,
        )
        self.log_server = LogServer(cert, key, ca.cert_path, self._find_log)
        self.runner = PodRunner(
            state_dir / "agent",
            state.network,
            ApiEndpoint(state.network.gateway, API_PORT_IN_PODS),
            ApiLookups(self.core, ca.cert_path),
        )

    # ----------------------------------------------------------------- start-up and shutdown
    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        from tpujob.local.agent.runtime import kill_leftover_pods

        kill_leftover_pods(self.state_dir)
        network.create_bridge(self.state.network)
        ApiForwarder(
            self.state.network.gateway, API_PORT_IN_PODS, self.state.apiserver_port
        ).start()
        self.log_server.start()
        self._register_nodes()
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()
        threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True).start()
        (self.state_dir / "agent").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "agent" / "ready").write_text(str(time.time()))
        try:
            while not self.stop.is_set():
                self.wake.wait(0.2)
                self.wake.clear()
                try:
                    self.tick(time.time())
                except Exception:
                    log.exception("reconcile failed; retrying")
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for rt in self.runtimes.values():
            for c in rt.containers:
                if c.running():
                    c.signal(signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline and any(
            c.running() and c.proc is not None and c.proc.poll() is None
            for rt in self.runtimes.values()
            for c in rt.containers
        ):
            time.sleep(0.1)
        for rt in self.runtimes.values():
            self.runner.remove(rt)
        (self.state_dir / "agent" / "ready").unlink(missing_ok=True)

    def _register_nodes(self) -> None:
        for spec in self.nodes.values():
            try:
                self.core.create_node(nodeplan.node_object(spec))
            except ApiException as err:
                if err.status != 409:
                    raise
            self._post_node_status(spec.name)
            self._renew_lease(spec.name)

    # --------------------------------------------------------------------- node heartbeats
    def _post_node_status(self, name: str) -> None:
        status = nodeplan.node_status(
            self.nodes[name],
            now=rfc3339(time.time()),
            tpu_healthy=not self.faults[name].tpu_unhealthy,
            log_port=self.log_server.port,
            ready_since=self.ready_since[name],
            ready=not self.faults[name].not_ready,
        )
        self.core.patch_node_status(name, {"status": status}, _content_type=MERGE_PATCH)

    def _renew_lease(self, name: str) -> None:
        coord = client.CoordinationV1Api(self.api_client)
        # MicroTime wants exactly six fractional digits; the client serialises a datetime
        # with isoformat, which drops them when the microseconds are zero.
        now = datetime.datetime.now(datetime.UTC)
        now = now.replace(microsecond=now.microsecond or 1)
        body = {
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now,
            }
        }
        try:
            coord.patch_namespaced_lease(name, "kube-node-lease", body, _content_type=MERGE_PATCH)
        except ApiException as err:
            if err.status != 404:
                raise
            body["metadata"] = {"name": name, "namespace": "kube-node-lease"}
            coord.create_namespaced_lease("kube-node-lease", body)

    def _heartbeats(self) -> None:
        last_status = 0.0
        while not self.stop.is_set():
            changed = self._refresh_faults()
            post = changed or time.time() - last_status >= STATUS_EVERY
            for name in self.nodes:
                if self.faults[name].silent:
                    continue
                try:
                    self._renew_lease(name)
                    if post:
                        self._post_node_status(name)
                except Exception as err:  # the API may be restarting; try again next beat
                    log.warning("heartbeat for %s failed: %s", name, err)
            if post:
                last_status = time.time()
            self.stop.wait(1.0)

    def _refresh_faults(self) -> bool:
        changed = False
        for name in self.nodes:
            new = read_faults(self.state_dir, name)
            old = self.faults[name]
            if new != old:
                changed = True
                # The Ready condition changes with each of these, so its transition time does.
                if (old.silent and not new.silent) or old.not_ready != new.not_ready:
                    self.ready_since[name] = rfc3339(time.time())
                self.faults[name] = new
                self.wake.set()
        return changed

    # ---------------------------------------------------------------------------- pod watch
    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return pod.get("spec", {}).get("nodeName") in self.nodes

    def _watch_pods(self) -> None:
        api = client.CoreV1Api(timed_client(self.kubeconfig))
        while not self.stop.is_set():
            try:
                listing = api.list_pod_for_all_namespaces()
                fresh = {}
                for obj in listing.items:
                    pod = api.api_client.sanitize_for_serialization(obj)
                    if self._ours(pod):
                        fresh[pod["metadata"]["uid"]] = pod
                with self.lock:
                    self.pods = fresh
                self.wake.set()
                stream = watch.Watch().stream(
                    api.list_pod_for_all_namespaces,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=WATCH_SECONDS,
                    # The server ends the watch; this ends it when a restarting apiserver
                    # never answers, so the pods are listed again.
                    _request_timeout=(REQUEST_TIMEOUT[0], WATCH_SECONDS + 30),
                )
                for event in stream:
                    if self.stop.is_set():
                        return
                    pod = api.api_client.sanitize_for_serialization(event["object"])
                    uid = pod["metadata"]["uid"]
                    with self.lock:
                        if event["type"] == "DELETED":
                            self.pods.pop(uid, None)
                        elif self._ours(pod):
                            self.pods[uid] = pod
                    self.wake.set()
            except Exception as err:
                log.info("pod watch restarts: %s", err)
                self.stop.wait(1.0)

    # --------------------------------------------------------------------------- reconcile
    def tick(self, now: float) -> None:
        with self.lock:
            pods = dict(self.pods)
        self._apply_node_faults(now)
        for uid, pod in pods.items():
            if self.faults[pod["spec"]["nodeName"]].silent:
                continue  # a crashed or cut-off kubelet reports nothing and finishes nothing
            self._reconcile(pod, self.runtimes.get(uid), now)
        # A stopped kubelet does not see its pods deleted; once back, it kills what is gone.
        for uid in [
            u
            for u, rt in self.runtimes.items()
            if u not in pods and not self.faults[rt.node].kubelet_stopped
        ]:
            self._kill_removed(self.runtimes[uid], now)
        self.runner.write_hosts((rt, pods[u]) for u, rt in self.runtimes.items() if u in pods)

    def _kill_removed(self, rt: PodRuntime, now: float) -> None:
        """A pod gone from the API while its containers run (force-deleted): SIGTERM, then
        SIGKILL after the kubelet's minimum grace period, as measured on kind (2 s)."""
        running = [c for c in rt.containers if c.running()]
        if running and rt.removed_kill_at is None:
            rt.removed_kill_at = now + MINIMUM_GRACE_SECONDS
            for c in running:
                c.signal(signal.SIGTERM)
        if running and rt.removed_kill_at is not None and now < rt.removed_kill_at:
            return
        del self.runtimes[rt.uid]
        self.runner.remove(rt)
        self.posted.pop(rt.uid, None)

    def _apply_node_faults(self, now: float) -> None:
        for rt in self.runtimes.values():
            down = self.faults[rt.node].down
            if down and not rt.node_lost:
                rt.node_lost = True
                for c in rt.containers:
                    c.kill_all()
                if rt.netns:
                    network.set_pod_link(self.state.network, rt.uid, up=False)
            elif not down and rt.node_lost:
                # The host came back: its pods' processes died with it, as after a reboot. The
                # kubelet then reports such a container as containerd does: exit code 255,
                # reason Unknown, no message (measured on kind, docs/kubelet-fidelity.md).
                for c in rt.containers:
                    if c.proc is not None and c.terminated is None:
                        c.proc.wait()
                        c.poll(now=now)
                        if c.terminated is not None:
                            c.terminated = Terminated(255, "Unknown", "", c.started_at, now)

    def _reconcile(self, pod: dict[str, Any], rt: PodRuntime | None, now: float) -> None:
        meta = pod["metadata"]
        deleting = meta.get("deletionTimestamp") is not None
        if rt is None:
            if deleting or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                if deleting:
                    self._finish_deletion(pod)
                return
            rt = self.runner.create(pod, now=now)
            self.runtimes[rt.uid] = rt
        for c in rt.containers:
            c.poll(now=now)
        if deleting:
            self._terminate(pod, rt, now)
            return
        if rt.mount_error is not None and now >= rt.mount_retry_at:
            self.runner.mount_and_start(pod, rt, now=now)
        if rt.mount_error is not None and rt.mount_error != rt.mount_error_reported:
            self._warn(pod, "FailedMount", rt.mount_error, now)
            rt.mount_error_reported = rt.mount_error
        if not rt.all_terminated():
            self.runner.refresh(pod, rt)
        for c in rt.containers:
            if rt.should_restart(c) and c.terminated is not None:
                if c.next_start_at == 0.0:
                    c.next_start_at = now + restart_delay(c.restart_count + 1)
                elif now >= c.next_start_at:
                    c.last_terminated, c.next_start_at = c.terminated, 0.0
                    c.restart_count += 1
                    self.runner.start_container(pod, rt, c, now=now)
        if rt.all_terminated() and rt.netns:
            self.runner.release_network(rt)
        self._post_status(pod, rt, now)

    def _terminate(self, pod: dict[str, Any], rt: PodRuntime, now: float) -> None:
        if rt.terminating_deadline is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            grace = 30 if grace is None else int(grace)
            # Never under the kubelet's floor, not even for a force delete (grace 0).
            rt.terminating_deadline = now + max(grace, MINIMUM_GRACE_SECONDS)
            for c in rt.containers:
                if c.running():
                    c.signal(signal.SIGTERM)
        running = [c for c in rt.containers if c.running()]
        if running and now < rt.terminating_deadline:
            return
        for c in running:
            c.kill_all()
            if c.proc is not None:
                c.proc.wait()
            c.poll(now=now)
        self._post_status(pod, rt, now)
        self.runner.remove(rt)
        self._finish_deletion(pod)

    def _finish_deletion(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def _warn(self, pod: Mapping[str, Any], reason: str, message: str, now: float) -> None:
        """A Warning event about `pod`, from the kubelet of its node, as the kubelet posts one."""
        meta, node, stamp = pod["metadata"], pod["spec"]["nodeName"], rfc3339(now)
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": node},
            "reportingComponent": "kubelet",
            "reportingInstance": node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as err:  # an event is worth a try, never a failed reconcile
            log.warning("event %s for %s failed: %s", reason, meta["name"], err)

    def _post_status(self, pod: Mapping[str, Any], rt: PodRuntime, now: float) -> None:
        status = pod_status(
            rt,
            pod.get("status") or {},
            now=now,
            tpu=tpu_devices(pod["spec"]),
            tpu_healthy=not self.faults[rt.node].tpu_unhealthy,
        )
        if self.posted.get(rt.uid) == status:
            return
        try:
            self.core.patch_namespaced_pod_status(
                rt.name, rt.namespace, {"status": status}, _content_type=MERGE_PATCH
            )
        except ApiException as err:
            if err.status == 404:
                return
            raise
        self.posted[rt.uid] = status

    def _find_log(self, namespace: str, pod: str, container: str, previous: bool) -> Path | None:
        for rt in list(self.runtimes.values()):
            if rt.namespace == namespace and rt.name == pod:
                for c in rt.containers:
                    if c.name == container:
                        count = c.restart_count - 1 if previous else c.restart_count
                        return c.directory / f"{max(0, count)}.log"
        return None
