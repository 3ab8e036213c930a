"""`make demo`: the product in five minutes on one machine.

Starts the local cluster, installs the operator with its Helm chart (the node agent runs the
operator's pod in-cluster, under the chart's ServiceAccount), submits the CPU-backed example,
shows live progress, then makes a soft fault (a worker killed) and a hard fault (its node
down) happen, shows each diagnosis, the recovery timeline and the goodput, and tears down.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from tpujob.api import GROUP, PLURAL, VERSION, labels, parse_job
from tpujob.console import describe_lines
from tpujob.local import controlplane, faults
from tpujob.local.binaries import binary_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cpu-local.yaml"
CHART = ROOT / "charts" / "tpujob-operator"
NAMESPACE = "demo"
DEMO_POOLS = controlplane.PoolOptions(
    pools=3, accelerator="tpu-v5-lite-podslice", topology="4x4", spare_nodes=1
)


class Demo:
    def __init__(self, state_dir: Path, console: Console) -> None:
        self.state_dir = state_dir.resolve()
        self.console = console
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.bins = binary_dir()

    def run_tool(self, tool: str, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [str(self.bins / tool), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=stdin,
            check=False,
            timeout=300,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{tool} {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def api(self) -> Any:
        from kubernetes import client, config

        return client.CustomObjectsApi(config.new_client_from_config(str(self.kubeconfig)))

    def status(self) -> dict[str, Any]:
        body = self.api().get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "cpu-local"
        )
        return dict(body)

    def start(self) -> None:
        say = self.console.print
        say(
            "[bold]1. local cluster[/bold]: etcd, kube-apiserver, scheduler, controller-manager, "
            "and a node agent faking three v5e 4x4 TPU node pools"
        )
        controlplane.up(self.state_dir, DEMO_POOLS, out=sys.stderr)
        say(f"   kubeconfig: {self.kubeconfig}  (export KUBECONFIG=... to kubectl around)")
        say(self.run_tool("kubectl", "get", "nodes", "-L", labels.NODEPOOL))
        say("[bold]2. operator[/bold]: helm install charts/tpujob-operator (CRDs from the chart)")
        self.run_tool("kubectl", "create", "namespace", NAMESPACE)
        # The chart admits hostPath checkpoints only under the prefixes it is given.
        self.run_tool(
            "helm",
            "install",
            "tpujob",
            str(CHART),
            "--namespace",
            "tpujob-system",
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
            "--set",
            f"hostPathPrefixes={{{self.state_dir / 'checkpoints'}}}",
            # A live progress bar: progress reaches the status every 2 s.
            "--set",
            "operator.extraArgs={--collective-timeout=15,"
            "--force-delete-after=3,--progress-interval=2}",
        )
        say("[bold]3. job[/bold]: kubectl apply -f examples/cpu-local.yaml")
        # Checkpoints go under the demo's state dir, so a second demo starts from step 0 and
        # teardown removes them.
        job = yaml.safe_load(EXAMPLE.read_text())
        job["spec"]["checkpoint"]["volume"]["hostPath"] = str(self.state_dir / "checkpoints")
        self.run_tool("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(job))

    def watch(self, until: Any, what: str, timeout: float = 600) -> dict[str, Any]:
        columns = (
            TextColumn("[bold]{task.fields[phase]:<10}"),
            BarColumn(),
            TextColumn(
                "step {task.completed:.0f}/{task.total:.0f}  loss "
                "{task.fields[loss]}  attempt {task.fields[attempt]}  restarts "
                "s/m/h {task.fields[restarts]}"
            ),
        )
        deadline = time.monotonic() + timeout
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(what, total=1, phase="", attempt=0, restarts="0/0/0", loss="-")
            while time.monotonic() < deadline:
                body = self.status()
                st = body.get("status") or {}
                progress = st.get("progress") or {}
                r = st.get("restarts") or {}
                loss = progress.get("loss")
                bar.update(
                    task,
                    completed=progress.get("step") or 0,
                    total=progress.get("totalSteps") or 1,
                    phase=st.get("phase", ""),
                    attempt=st.get("attempt", 0),
                    loss=f"{loss:.3f}" if isinstance(loss, float | int) else "-",
                    restarts=f"{r.get('soft', 0)}/{r.get('medium', 0)}/{r.get('hard', 0)}",
                )
                if until(st):
                    if isinstance(loss, float | int):  # the loss keeps falling across restarts
                        self.console.print(
                            f"   attempt {st.get('attempt')}, step "
                            f"{progress.get('step')}: loss {loss:.3f}"
                        )
                    return body
                time.sleep(0.5)
        raise SystemExit(f"timed out waiting for {what}")

    def show_failure(self, body: dict[str, Any]) -> None:
        failure = (body.get("status") or {}).get("lastFailure") or {}
        self.console.print(
            f"   diagnosis: [{failure.get('class', '').upper()}] "
            f"{failure.get('code')}: {failure.get('summary')}",
            markup=False,
        )
        for link in failure.get("chain", []):
            self.console.print(f"      chain: {link}", markup=False)
        self.console.print(f"   action: {failure.get('action')}", markup=False)

    def faults(self) -> None:
        say = self.console.print
        self.watch(lambda s: (s.get("progress") or {}).get("step", 0) >= 60, "training")
        say("[bold]4. soft fault[/bold]: tpujob local fault kill cpu-local-1-0-2 (SIGKILL)")
        faults.kill_pod(
            self.state_dir, faults.find_pod(self.state_dir, "cpu-local-1-0-2", NAMESPACE)
        )
        body = self.watch(
            lambda s: s.get("attempt", 0) >= 2 and s.get("phase") == "Running",
            "recovery from the soft fault",
        )
        self.show_failure(body)
        self.watch(lambda s: (s.get("progress") or {}).get("step", 0) >= 160, "training")
        node = self._node_of_worker(body, 1)
        say(f"[bold]5. hard fault[/bold]: tpujob local fault node-down {node}")
        faults.set_node_fault(self.state_dir, node, down=True)
        body = self.watch(
            lambda s: s.get("attempt", 0) >= 3 and s.get("phase") == "Running",
            "recovery from the hard fault",
        )
        self.show_failure(body)
        body = self.watch(lambda s: s.get("phase") in ("Succeeded", "Failed"), "the end")
        say(f"[bold]6. {body['status']['phase']}[/bold]: tpujob describe cpu-local -n {NAMESPACE}")
        for line in describe_lines(parse_job(body), datetime.now(UTC)):
            say(line, highlight=False)
        faults.set_node_fault(self.state_dir, node, down=False)

    def _node_of_worker(self, body: dict[str, Any], worker: int) -> str:
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        attempt = body["status"]["attempt"]
        pods = core.list_namespaced_pod(
            NAMESPACE,
            label_selector=(
                f"{labels.JOB}=cpu-local,{labels.ATTEMPT}={attempt},{labels.WORKER}={worker}"
            ),
        ).items
        return str(pods[0].spec.node_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".state" / "demo")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    console = Console()
    demo = Demo(args.state_dir, console)
    try:
        demo.start()
        demo.faults()
    finally:
        if args.keep:
            console.print(
                f"cluster left running: export KUBECONFIG={demo.kubeconfig}; "
                f"`tpujob local down --state-dir {demo.state_dir}` stops it"
            )
        else:
            controlplane.down(demo.state_dir, purge=True)
            console.print("cluster stopped and removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
