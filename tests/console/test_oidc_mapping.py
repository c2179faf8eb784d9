"""The groups claim of a single sign-on mapped onto Django groups: pure functions, no database."""

import pytest

from console.oidc.mapping import (
    GroupChanges,
    claim_values,
    group_changes,
    parse_group_map,
    username_base,
)

GROUP_MAP = {"sre-leads": "admin", "sre": "operator", "payments": "team-payments"}


def test_claimed_groups_are_joined():
    changes = group_changes({"sre", "payments"}, GROUP_MAP, current=set())
    assert changes == GroupChanges(add=frozenset({"operator", "team-payments"}), remove=frozenset())


def test_mapped_groups_whose_claim_is_gone_are_left():
    changes = group_changes({"payments"}, GROUP_MAP, current={"operator", "team-payments"})
    assert changes == GroupChanges(add=frozenset(), remove=frozenset({"operator"}))


def test_groups_outside_the_map_are_never_touched():
    # "oncall" is Backstop's own group; "marketing" is a claim value nothing maps.
    changes = group_changes({"marketing"}, GROUP_MAP, current={"oncall", "admin"})
    assert changes == GroupChanges(add=frozenset(), remove=frozenset({"admin"}))


def test_no_claim_leaves_every_mapped_group():
    changes = group_changes(set(), GROUP_MAP, current={"admin", "operator", "oncall"})
    assert changes.add == frozenset()
    assert changes.remove == {"admin", "operator"}


def test_a_group_two_claim_values_map_to_stays_while_one_is_claimed():
    group_map = {"sre": "operator", "sre-oncall": "operator"}
    changes = group_changes({"sre-oncall"}, group_map, current={"operator"})
    assert changes == GroupChanges(add=frozenset(), remove=frozenset())


def test_claim_values_accepts_a_list_or_one_string():
    assert claim_values({"groups": ["a", "b", 3, None]}, "groups") == {"a", "b"}
    assert claim_values({"groups": "a"}, "groups") == {"a"}
    assert claim_values({"groups": None}, "groups") == frozenset()
    assert claim_values({"groups": {"a": 1}}, "groups") == frozenset()
    assert claim_values({}, "groups") == frozenset()
    assert claim_values({"roles": ["x"]}, "roles") == {"x"}


def test_parse_group_map():
    assert parse_group_map('{"sre": " operator "}') == {"sre": "operator"}
    assert parse_group_map("  ") == {}


@pytest.mark.parametrize(
    "raw, message",
    [
        ('["admin"]', "JSON object"),
        ('{"sre": ""}', "'sre'"),
        ('{"sre": ["operator"]}', "'sre'"),
        ("{sre: admin}", "Expecting property name"),
    ],
)
def test_parse_group_map_refuses_what_is_not_a_map_of_names(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_group_map(raw)


def test_username_base_prefers_the_user_name_then_email_then_subject():
    assert username_base({"preferred_username": "ada", "email": "a@x", "sub": "1"}) == "ada"
    assert username_base({"email": "ada@example.org", "sub": "1"}) == "ada@example.org"
    assert username_base({"sub": "auth0|123"}) == "auth0-123"
    assert username_base({"preferred_username": "Ada Lovelace"}) == "Ada-Lovelace"
    assert username_base({"preferred_username": "///"}) == "oidc-user"
    assert len(username_base({"preferred_username": "x" * 400})) == 150
