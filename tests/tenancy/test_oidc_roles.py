"""OIDC_ROLE_MAP's parser and the grants it gives (pure: no Django, no database)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenancy.oidc_roles import (
    Grants,
    RoleMapError,
    RoleRule,
    grants_for,
    parse_role_map,
    role_rank,
)


def test_the_documented_example_parses() -> None:
    rules = parse_role_map("ml-team:team-a:member,ml-leads:team-a:owner,admins:*:staff")
    assert rules == (
        RoleRule("ml-team", "team-a", "member"),
        RoleRule("ml-leads", "team-a", "owner"),
        RoleRule("admins", "*", "staff"),
    )


def test_whitespace_and_newlines_around_rules_are_ignored() -> None:
    rules = parse_role_map("  ml-team : acme : viewer ,\n  ops:globex:member\n")
    assert rules == (RoleRule("ml-team", "acme", "viewer"), RoleRule("ops", "globex", "member"))


def test_a_claim_value_may_contain_colons() -> None:
    assert parse_role_map("org:team:ml:acme:member") == (RoleRule("org:team:ml", "acme", "member"),)


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_an_empty_map_has_no_rules(text: str) -> None:
    assert parse_role_map(text) == ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ml-team:acme", "expected VALUE:TENANT:ROLE"),
        ("ml-team", "expected VALUE:TENANT:ROLE"),
        ("ml-team:acme:boss", "unknown role 'boss'"),
        ("ml-team:acme:Member", "unknown role 'Member'"),
        ("ml-team:Acme:member", "'Acme' is not a tenant slug"),
        ("ml-team:acme corp:member", "'acme corp' is not a tenant slug"),
        ("ml-team:" + "a" * 51 + ":member", "is not a tenant slug"),
        ("ml-team:*:member", "'*' is not a tenant slug"),
        ("admins:acme:staff", "role 'staff' (cluster admin) takes tenant '*'"),
        (":acme:member", "the claim value is empty"),
        ("a:acme:member,,b:acme:viewer", "empty rule"),
        ("a:acme:member,", "empty rule"),
        (",a:acme:member", "empty rule"),
        ("a:acme:member,a:acme:owner", "gives 'a' in 'acme' twice ('member' and 'owner')"),
    ],
)
def test_a_malformed_map_is_refused_naming_the_rule(text: str, says: str) -> None:
    with pytest.raises(RoleMapError, match="OIDC_ROLE_MAP") as caught:
        parse_role_map(text)
    assert says in str(caught.value)


RULES = parse_role_map(
    "ml-team:acme:member,ml-leads:acme:owner,auditors:acme:viewer,auditors:globex:viewer,"
    "admins:*:staff"
)


def test_the_highest_role_per_tenant_wins() -> None:
    grants = grants_for(RULES, ["auditors", "ml-team", "ml-leads"])
    assert grants == Grants(tenant_roles=(("acme", "owner"), ("globex", "viewer")), staff=False)
    assert grants.role_in("acme") == "owner"
    assert grants.role_in("initech") is None


def test_staff_comes_only_from_a_staff_rule() -> None:
    assert grants_for(RULES, ["admins"]) == Grants(tenant_roles=(), staff=True)
    assert not grants_for(RULES, ["ml-team"]).staff


def test_groups_the_map_does_not_name_give_nothing() -> None:
    assert grants_for(RULES, ["strangers", "ML-TEAM", "ml-team "]) == Grants((), staff=False)


def test_role_rank_orders_roles() -> None:
    assert role_rank("viewer") < role_rank("member") < role_rank("owner")
    assert role_rank("staff") == role_rank("") == -1


@given(st.lists(st.sampled_from(["ml-team", "ml-leads", "auditors", "admins", "x"])))
def test_grants_are_the_best_rule_for_each_tenant(groups: list[str]) -> None:
    grants = grants_for(RULES, groups)
    for slug, role in grants.tenant_roles:
        given_here = [r.role for r in RULES if r.tenant == slug and r.group in groups]
        assert role == max(given_here, key=role_rank)
    named = {r.tenant for r in RULES if r.group in groups and r.role != "staff"}
    assert {slug for slug, _ in grants.tenant_roles} == named
