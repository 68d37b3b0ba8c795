"""policy.yaml network_whitelist: parsing, normalisation and matching on the authority."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluffy.errors import PolicyError
from fluffy.kernel.net.allowlist import AllowList, AuthorityError, Rule, parse_target

pytestmark = pytest.mark.unit


def test_a_bare_host_admits_port_443_only_and_names_its_entry() -> None:
    allow = AllowList.from_entries(["api.openai.com"])
    assert allow.allows("api.openai.com", 443) == "api.openai.com"
    assert allow.allows("api.openai.com", 80) is None
    assert allow.allows("openai.com", 443) is None
    assert allow.allows("evil-api.openai.com", 443) is None


def test_host_port_admits_that_port_only() -> None:
    allow = AllowList.from_entries(["ollama.local:11434", "127.0.0.1:11434"])
    assert allow.allows("ollama.local", 11434) == "ollama.local:11434"
    assert allow.allows("ollama.local", 443) is None
    assert allow.allows("127.0.0.1", 11434) == "127.0.0.1:11434"
    assert allow.allows("127.0.0.1", 11435) is None


def test_a_wildcard_admits_strict_subdomains_on_443_unless_a_port_is_given() -> None:
    allow = AllowList.from_entries(["*.example.com", "*.corp.test:8443"])
    assert allow.allows("a.example.com", 443) == "*.example.com"
    assert allow.allows("a.b.example.com", 443) == "*.example.com"
    assert allow.allows("example.com", 443) is None  # the apex is not a subdomain
    assert allow.allows("badexample.com", 443) is None
    assert allow.allows("a.example.com", 8443) is None
    assert allow.allows("x.corp.test", 8443) == "*.corp.test:8443"
    assert allow.allows("x.corp.test", 443) is None


def test_matching_ignores_case_and_one_trailing_dot_on_both_sides() -> None:
    allow = AllowList.from_entries(["  API.Example.COM.:8080 "])
    assert allow.allows("api.example.com", 8080) == "API.Example.COM.:8080"
    assert allow.allows("API.EXAMPLE.COM.", 8080) == "API.Example.COM.:8080"
    assert allow.allows("api.example.com..", 8080) is None


def test_ipv6_literals_are_bracketed_and_compared_as_addresses() -> None:
    allow = AllowList.from_entries(["[::1]:8080", "[2001:DB8::0:1]"])
    assert allow.allows("::1", 8080) == "[::1]:8080"
    assert allow.allows("[::1]", 8080) == "[::1]:8080"
    assert allow.allows("[0:0:0:0:0:0:0:1]", 8080) == "[::1]:8080"
    assert allow.allows("2001:db8::1", 443) == "[2001:DB8::0:1]"
    assert allow.allows("::1", 443) is None


def test_ip_targets_need_a_literal_entry_and_names_never_match_ips() -> None:
    allow = AllowList.from_entries(["localhost:11434", "*.example.com"])
    assert allow.allows("127.0.0.1", 11434) is None  # no resolving of "localhost"
    assert allow.allows("localhost", 11434) == "localhost:11434"
    # forms the C resolver reads as 127.0.0.1 are no hostnames either
    literal = AllowList.from_entries(["127.0.0.1:443"])
    for sneaky in ("2130706433", "0x7f000001", "127.1", "0177.0.0.1", "127.0.0.1.example.1"):
        assert literal.allows(sneaky, 443) is None, sneaky


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "*",
        "*.com",
        "a*.example.com",
        "*.*.example.com",
        "*.127.0.0.1",
        "example.com:0",
        "example.com:65536",
        "example.com:https",
        "example.com:",
        "::1",
        "[::1",
        "[::1]8080",
        "[example.com]:443",
        "http://example.com",
        "example.com/path",
        "exa mple.com",
        "-bad.example.com",
        "ex_ample.com",
        "bücher.de",
        "2130706433",
        "0x7f000001",
        "127.1",
        "user@example.com",
    ],
)
def test_invalid_entries_are_refused_naming_the_entry(entry: str) -> None:
    with pytest.raises(PolicyError) as info:
        AllowList.from_entries(["good.example.com", entry])
    assert repr(entry) in info.value.what
    assert "network_whitelist" in info.value.what
    assert "host:port" in info.value.why


def test_read_says_why_an_entry_is_not_one_without_naming_the_policy() -> None:
    assert Rule.read(" API.example.com:8443 ").entry == "API.example.com:8443"
    with pytest.raises(AuthorityError, match=r"'\*' is allowed only"):
        Rule.read("a.*.example.com")
    with pytest.raises(AuthorityError, match="cannot cover IP"):
        Rule.read("*.10.0.0.1")


@pytest.mark.parametrize(
    ("entry", "covered"),
    [
        ("api.example.com", True),  # a hostname rule
        ("API.example.com.", True),
        ("api.example.com:8443", False),  # another port
        ("deep.sub.example.org", True),  # under the wildcard
        ("example.org", False),  # a wildcard does not admit its apex
        ("*.sub.example.org", True),  # a narrower wildcard
        ("*.example.org", True),  # the same wildcard
        ("*.co.example.org", True),
        ("*.example.org:8080", False),
        ("*.example.com", False),  # hostnames never cover a wildcard
        ("127.0.0.1:8080", True),
        ("127.0.0.2:8080", False),
    ],
)
def test_covers_says_whether_a_rule_admits_nothing_more_than_the_list(
    entry: str, covered: bool
) -> None:
    allow = AllowList.from_entries(["api.example.com", "*.example.org", "127.0.0.1:8080"])
    assert allow.covers(Rule.read(entry)) is covered
    # a wider wildcard is not covered by a narrower one
    assert not AllowList.from_entries(["*.sub.example.org"]).covers(Rule.read("*.example.org"))


def test_a_single_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(PolicyError, match="list"):
        AllowList.from_entries("api.openai.com")


def test_connect_targets_need_a_port_and_keep_ipv6_brackets_in_their_authority() -> None:
    assert parse_target("Example.COM.:443").authority == "example.com:443"
    assert parse_target("[::1]:8080").authority == "[::1]:8080"
    for bad in ("example.com", "[::1]", "example.com:99999", "http://x:1", ":443", "a b:1"):
        with pytest.raises(AuthorityError):
            parse_target(bad)


_label = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
_host = st.lists(_label, min_size=2, max_size=4).map(".".join)
_port = st.integers(1, 65535)


@given(host=_host, port=_port, other=_port)
def test_any_valid_host_port_entry_admits_exactly_itself(host: str, port: int, other: int) -> None:
    entry = f"{host}:{port}"
    allow = AllowList.from_entries([entry])
    assert allow.allows(host.upper() + ".", port) == entry
    assert allow.allows(host, other) == (entry if other == port else None)
    assert allow.allows("x" + host, port) is None


@given(host=_host, sub=_label)
def test_any_wildcard_admits_subdomains_but_not_its_apex(host: str, sub: str) -> None:
    allow = AllowList.from_entries([f"*.{host}"])
    assert allow.allows(f"{sub}.{host}", 443) == f"*.{host}"
    assert allow.allows(host, 443) is None


@given(text=st.text(max_size=40), port=st.integers(-5, 70000))
def test_arbitrary_text_either_parses_or_raises_policy_error_and_never_crashes_matching(
    text: str, port: int
) -> None:
    try:
        AllowList.from_entries([text])
    except PolicyError:
        pass
    assert AllowList.from_entries(["example.com"]).allows(text, port) in (None, "example.com")
