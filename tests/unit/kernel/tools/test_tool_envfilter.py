"""Plugin sandboxes start from an empty environment; extras are filtered again."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fluffy.kernel.tools.sandbox.envfilter import (
    BASE_ENV,
    EnvResult,
    sandbox_environment,
    secret_name,
)

ROOT = Path(__file__).resolve().parents[4]
FAKE_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_ACCESS_KEY_ID": "AKIAABCDEFGHIJKLMNOP",
    "AZURE_CLIENT_SECRET": "azure-fake-value-1",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/gcp.json",
    "GCP_SA_JSON": '{"type": "service_account"}',
    "OPENAI_API_KEY": "sk-proj-abcdefghijklmnopqrstuvwxyz",
    "ANTHROPIC_API_KEY": "sk-ant-abcdefghijklmnopqrstuvwxyz",
    "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "GH_TOKEN": "gho_abcdefghijklmnopqrstuvwxyz0123",
    "GITLAB_PAT": "glpat-abcdefghijklmnopqrst",
    "NPM_CONFIG_AUTHTOKEN": "npm_" + "a" * 36,
    "DOCKER_AUTH_CONFIG": '{"auths":{}}',
    "KUBECONFIG": "/home/me/.kube/config",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent",
    "GPG_AGENT_INFO": "/run/gpg",
    "MY_SERVICE_TOKEN": "opaque-1",
    "DB_PASSWORD": "hunter2-fake",
    "APP_SECRET": "opaque-2",
    "SIGNING_KEY": "opaque-3",
    "STRIPE_API_KEY": "opaque-4",
    "SERVICE_CREDENTIALS": "opaque-5",
    "DEPLOY_PRIVATE_KEY": "opaque-6",
    "DATABASE_URL": "postgres://u:pw@db/x",
    "innocent_looking": "xoxb-1234567890-abcdef",  # secret by value, not by name
    "github_token": "lowercase names are matched too",
}


def test_the_base_is_fixed_and_the_host_environment_is_not_inherited() -> None:
    source = {"PATH": "/evil/bin", "HOME": "/root", "USER": "root", "OPENAI_API_KEY": "sk-x"}
    result = sandbox_environment(source=source)
    assert result.env == dict(BASE_ENV)
    assert result.env["HOME"] == "/tmp" and result.env["TMPDIR"] == "/tmp"
    assert result.env["LANG"] == "C.UTF-8"
    assert result.env["PYTHONDONTWRITEBYTECODE"] == "1" == result.env["PYTHONUNBUFFERED"]
    assert result.dropped == {}


def test_path_and_lang_are_the_images_own() -> None:
    dockerfile = (ROOT / "images/python-base/Dockerfile").read_text(encoding="utf-8")
    assert re.search(rf"ENV PATH={re.escape(BASE_ENV['PATH'])}\s", dockerfile)
    assert re.search(rf"LANG={re.escape(BASE_ENV['LANG'])}\s", dockerfile)


@pytest.mark.parametrize(
    ("tz", "kept"),
    [("Europe/Paris", True), ("UTC", True), (":/etc/localtime", True), ("a b", False)],
)
def test_tz_comes_from_the_source_when_plain(tz: str, kept: bool) -> None:
    env = sandbox_environment(source={"TZ": tz}).env
    assert (env.get("TZ") == tz) is kept
    assert "TZ" in env or not kept


def test_harmless_extras_pass() -> None:
    result = sandbox_environment({"PYTEST_ADDOPTS": "-q", "FORCE_COLOR": "0"}, source={})
    assert result.env["PYTEST_ADDOPTS"] == "-q" and result.env["FORCE_COLOR"] == "0"
    assert result.dropped == {}


@pytest.mark.parametrize("name", sorted(FAKE_SECRETS))
def test_each_credential_is_dropped_and_reported_by_name(name: str) -> None:
    result = sandbox_environment({name: FAKE_SECRETS[name]}, source={})
    assert name not in result.env
    assert name in result.dropped
    assert FAKE_SECRETS[name] not in repr(result) + str(result.dropped)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("PATH", "fixed by the sandbox"),
        ("HOME", "fixed by the sandbox"),
        ("TZ", "fixed by the sandbox"),
        ("LD_PRELOAD", "changes what code programs load"),
        ("PYTHONPATH", "changes what code programs load"),
        ("DYLD_INSERT_LIBRARIES", "changes what code programs load"),
        ("BASH_ENV", "changes what code programs load"),
        ("NODE_OPTIONS", "changes what code programs load"),
        ("1BAD", "not a plain variable name"),
        ("A=B", "not a plain variable name"),
        ("", "not a plain variable name"),
    ],
)
def test_fixed_loader_and_malformed_names_are_dropped(name: str, reason: str) -> None:
    result = sandbox_environment({name: "value"}, source={})
    assert result.dropped == {name: reason}
    assert result.env == dict(BASE_ENV)


def test_malformed_values_are_dropped() -> None:
    result = sandbox_environment({"A": "x\0y", "B": "z" * 100_000}, source={})
    assert result.dropped == {
        "A": "value is not a plain string",
        "B": "value is not a plain string",
    }


@pytest.mark.parametrize(
    "name", ["GIT_AUTHOR_NAME", "PYTEST_ADDOPTS", "CI", "COLUMNS", "KEYBOARD", "TOKENIZERS_WORKERS"]
)
def test_harmless_names_are_not_mistaken_for_credentials(name: str) -> None:
    assert not secret_name(name)


def test_the_real_host_environment_with_fake_secrets_leaks_none_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in FAKE_SECRETS.items():
        monkeypatch.setenv(name, value)
    host = dict(os.environ)
    assert set(FAKE_SECRETS) <= set(host)
    for extra in (None, host):
        result = sandbox_environment(extra)
        assert isinstance(result, EnvResult)
        for name, value in FAKE_SECRETS.items():
            assert name not in result.env
            assert value not in result.env.values()
            assert value not in repr(result)
        for name in BASE_ENV:
            assert result.env[name] == BASE_ENV[name]
    assert set(FAKE_SECRETS) <= set(sandbox_environment(host).dropped)
