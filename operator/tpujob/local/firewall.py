"""Let the local cluster's pod traffic through the host's FORWARD chain, whatever its policy.

Docker sets the filter table's FORWARD policy to DROP and turns bridge netfilter on
(`net.bridge.bridge-nf-call-iptables=1`). From then on every IPv4 frame a Linux bridge passes
between two of its ports also goes through iptables' FORWARD chain, so frames between two pods
on the cluster's bridge are dropped: trainers reach the API (the gateway, through INPUT) but
not each other, and hang in `jax.distributed` start-up.

The decision, and why:

* One rule per cluster, `-i BRIDGE -o BRIDGE -j ACCEPT`, as Docker's own rule for docker0.
  Bridge netfilter hands a bridged frame to the IP hooks with the bridge itself as both the in
  and the out device (the ports show only to the physdev match), so the rule matches exactly
  the traffic between this cluster's pods and nothing else. Nothing else needs it: pods reach
  the host through INPUT, which Docker leaves alone, and no route leads out of the pod network.
* Inserted at the top of FORWARD, ahead of anything that drops or rejects (firewalld's final
  REJECT, Docker's isolation chains); Docker inserting its own jumps above it later is harmless,
  as they return what is not Docker's.
* Tagged with an iptables comment naming the bridge (`tpujob-local:BRIDGE`). Removal lists the
  chain and deletes exactly the rules with that tag, duplicates included: `tpujob local down`
  removes its cluster's rule and nothing else. A cluster whose state went without a `down`
  leaves a rule whose bridge no longer exists; the next `up` removes those.
* The `iptables` command on PATH, whichever backend it is (nft or legacy): Docker calls the
  same command, so the rule lands in the table whose policy Docker set. Without the command
  nothing is done, as nothing can have set a FORWARD policy through it.
* The machine's policy and bridge-netfilter setting are never touched.

Pure parts (the rule, reading `iptables -S` back) are separate from the few commands that run.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CHAIN = "FORWARD"
TAG_PREFIX = "tpujob-local:"
# Seconds to wait for the xtables lock that iptables-legacy takes (iptables-nft ignores it):
# another cluster, or Docker, may be changing rules at the same moment.
LOCK_WAIT = "10"


class FirewallError(RuntimeError):
    """An `iptables` command failed; the message names it."""


@dataclass(frozen=True)
class TaggedRule:
    """A rule of ours found in the chain: the bridge its tag names and its spec as listed."""

    bridge: str
    spec: tuple[str, ...]  # what follows `-A FORWARD`, as `iptables -D FORWARD` takes it


def tag(bridge: str) -> str:
    return f"{TAG_PREFIX}{bridge}"


def allow_rule(bridge: str) -> tuple[str, ...]:
    """The rule that lets frames between the ports of `bridge` through FORWARD."""
    return ("-i", bridge, "-o", bridge, "-m", "comment", "--comment", tag(bridge), "-j", "ACCEPT")


def tagged_rules(listing: str) -> list[TaggedRule]:
    """Our rules in the output of `iptables -S FORWARD`, in chain order.

    A rule is ours when its comment starts with the tag prefix; iptables prints the comment
    quoted or not depending on its version, which `shlex` reads either way.
    """
    found = []
    for line in listing.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[:2] != ["-A", CHAIN]:
            continue
        spec = tuple(words[2:])
        comment = next((spec[i + 1] for i, w in enumerate(spec[:-1]) if w == "--comment"), "")
        if comment.startswith(TAG_PREFIX) and len(comment) > len(TAG_PREFIX):
            found.append(TaggedRule(comment[len(TAG_PREFIX) :], spec))
    return found


@dataclass(frozen=True)
class Changes:
    """What to do to the chain so that exactly one rule lets `bridge` through."""

    delete: tuple[TaggedRule, ...]
    insert: bool


def plan_allow(
    rules: Sequence[TaggedRule], bridge: str, *, bridge_exists: Callable[[str], bool]
) -> Changes:
    """Keep the first rule for `bridge` (insert one if there is none), delete its duplicates
    and the rules of bridges that no longer exist (clusters gone without a `down`)."""
    own = [r for r in rules if r.bridge == bridge]
    stale = [r for r in rules if r.bridge != bridge and not bridge_exists(r.bridge)]
    return Changes(delete=(*own[1:], *stale), insert=not own)


def plan_remove(rules: Sequence[TaggedRule], bridge: str) -> tuple[TaggedRule, ...]:
    return tuple(r for r in rules if r.bridge == bridge)


# ------------------------------------------------------------------------------------ effects
def iptables_command() -> str | None:
    return shutil.which("iptables")


def run_iptables(binary: str, args: Sequence[str], *, check: bool = True) -> str:
    argv = [binary, "-w", LOCK_WAIT, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:
        raise FirewallError(f"iptables {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _delete(binary: str, rules: Sequence[TaggedRule]) -> None:
    # Another cluster's `up` may be removing the same stale rule at the same moment: a rule
    # already gone is what was wanted.
    for rule in rules:
        run_iptables(binary, ["-D", CHAIN, *rule.spec], check=False)


def _interface_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def allow_bridge(bridge: str) -> bool:
    """Make sure one rule at the top of FORWARD lets `bridge`'s traffic through; idempotent.

    Returns False when the machine has no `iptables` command (nothing to do).
    """
    binary = iptables_command()
    if binary is None:
        return False
    rules = tagged_rules(run_iptables(binary, ["-S", CHAIN]))
    changes = plan_allow(rules, bridge, bridge_exists=_interface_exists)
    _delete(binary, changes.delete)
    if changes.insert:
        run_iptables(binary, ["-I", CHAIN, "1", *allow_rule(bridge)])
    return True


def remove_bridge(bridge: str) -> None:
    """Delete every rule tagged with `bridge`; nothing else in the chain changes."""
    binary = iptables_command()
    if binary is None:
        return
    listing = run_iptables(binary, ["-S", CHAIN], check=False)
    _delete(binary, plan_remove(tagged_rules(listing), bridge))


def bridge_rules(bridge: str) -> list[TaggedRule]:
    """The rules tagged with `bridge` now in FORWARD (empty without `iptables`)."""
    binary = iptables_command()
    if binary is None:
        return []
    return list(plan_remove(tagged_rules(run_iptables(binary, ["-S", CHAIN])), bridge))
