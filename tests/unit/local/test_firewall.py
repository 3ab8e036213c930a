"""The FORWARD rule that lets a local cluster's bridge traffic through, and finding it again."""

from __future__ import annotations

import pytest

from tpujob.local import firewall
from tpujob.local.firewall import TaggedRule

OURS = ("-i", "tpjaaaa", "-o", "tpjaaaa", "-m", "comment", "--comment", "tpujob-local:tpjaaaa")
DOCKER_FORWARD = """\
-P FORWARD DROP
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
"""


def rule(bridge: str) -> TaggedRule:
    return TaggedRule(bridge, firewall.allow_rule(bridge))


def test_the_rule_accepts_frames_in_and_out_of_the_bridge_and_names_it_in_its_comment() -> None:
    assert firewall.allow_rule("tpjaaaa") == (*OURS, "-j", "ACCEPT")


def test_the_rule_as_iptables_lists_it_back_is_found_with_the_spec_that_deletes_it() -> None:
    spec = firewall.allow_rule("tpjaaaa")
    listing = DOCKER_FORWARD + "-A FORWARD " + " ".join(spec) + "\n"
    assert firewall.tagged_rules(listing) == [TaggedRule("tpjaaaa", spec)]


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        ("-P FORWARD ACCEPT\n", []),
        (DOCKER_FORWARD, []),
        (
            "-A FORWARD -i tpjaaaa -o tpjaaaa"
            ' -m comment --comment "tpujob-local:tpjaaaa" -j ACCEPT',
            [rule("tpjaaaa")],
        ),
        (
            "-P FORWARD DROP\n"
            "-A FORWARD -i tpjbbbb -o tpjbbbb -m comment --comment tpujob-local:tpjbbbb -j ACCEPT\n"
            "-A FORWARD -j DOCKER-USER\n"
            "-A FORWARD -i tpjaaaa -o tpjaaaa -m comment --comment tpujob-local:tpjaaaa -j ACCEPT",
            [rule("tpjbbbb"), rule("tpjaaaa")],
        ),
        ('-A FORWARD -m comment --comment "a rule of someone else" -j ACCEPT', []),
        ('-A FORWARD -m comment --comment "tpujob-local:" -j ACCEPT', []),
        ('-A DOCKER-USER -m comment --comment "tpujob-local:tpjaaaa" -j RETURN', []),
        ('-A FORWARD -m comment --comment "unbalanced', []),
    ],
    ids=[
        "an empty chain",
        "docker's rules only",
        "ours with the comment quoted",
        "two clusters' among docker's, in chain order",
        "someone else's comment",
        "the prefix alone names no bridge",
        "another chain",
        "a line shlex cannot read",
    ],
)
def test_only_rules_of_forward_tagged_with_a_bridge_are_ours(
    listing: str, expected: list[TaggedRule]
) -> None:
    assert firewall.tagged_rules(listing) == expected


@pytest.mark.parametrize(
    ("rules", "existing", "delete", "insert"),
    [
        ([], {"tpjaaaa"}, [], True),
        ([rule("tpjaaaa")], {"tpjaaaa"}, [], False),
        ([rule("tpjaaaa"), rule("tpjaaaa")], {"tpjaaaa"}, [rule("tpjaaaa")], False),
        ([rule("tpjgone")], {"tpjaaaa"}, [rule("tpjgone")], True),
        ([rule("tpjbbbb")], {"tpjaaaa", "tpjbbbb"}, [], True),
        ([rule("tpjaaaa")], set(), [], False),
    ],
    ids=[
        "none yet: insert one",
        "already there: nothing to do",
        "a duplicate is deleted, the first kept",
        "a leftover of a bridge that is gone is deleted",
        "another running cluster's rule is kept",
        "its own rule is kept even before its bridge shows",
    ],
)
def test_allowing_a_bridge_leaves_exactly_one_rule_for_it_and_none_for_bridges_gone(
    rules: list[TaggedRule], existing: set[str], delete: list[TaggedRule], insert: bool
) -> None:
    changes = firewall.plan_allow(rules, "tpjaaaa", bridge_exists=existing.__contains__)
    assert changes == firewall.Changes(delete=tuple(delete), insert=insert)


def test_removing_a_bridge_deletes_all_its_rules_and_no_other() -> None:
    rules = [rule("tpjaaaa"), rule("tpjbbbb"), rule("tpjaaaa")]
    assert firewall.plan_remove(rules, "tpjaaaa") == (rule("tpjaaaa"), rule("tpjaaaa"))
    assert firewall.plan_remove(rules, "tpjcccc") == ()
