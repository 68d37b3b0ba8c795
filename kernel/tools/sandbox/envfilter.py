"""The environment a plugin sandbox starts with: empty, plus a fixed harmless set.

Nothing of the kernel's (or the host's) environment reaches a sandbox by default.  The
sandbox gets :data:`BASE_ENV` (the values of ``images/python-base/Dockerfile``),
``TZ`` when the source environment has a plain one, and whatever the caller asks for in
``extra`` -- filtered again, because ``extra`` is how a host secret would leak:

* names that look like credentials are dropped: the prefixes and suffixes of
  KarnEvil9's shell-handler filter (``docs/design/related-karnevil9-architecture.md``,
  "Environment Variable Sanitization": prefixes ``AWS_ AZURE_ GCP_ GOOGLE_ OPENAI_
  ANTHROPIC_ GITHUB_ GITLAB_``, suffixes ``TOKEN SECRET PASSWORD CREDENTIAL API_KEY
  PRIVATE_KEY``) plus fluffy's own additions (:data:`SECRET_PREFIXES`,
  :data:`SECRET_SUFFIXES`, :data:`SECRET_WORDS`);
* names that change how programs load code (``LD_PRELOAD``, ``PYTHONPATH``, ...) and
  the fixed names themselves (``PATH``, ``HOME``, ...) cannot be set;
* values that contain a known secret shape (:mod:`fluffy.kernel.redaction`) are dropped
  whatever their name;
* malformed names or values (``=``, NUL, empty name) are dropped.

Dropped entries are reported by name and reason only, never by value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final

import msgspec

from fluffy.kernel.redaction import Redactor

#: The image's own values (images/python-base/Dockerfile ``ENV``), plus HOME and TMPDIR.
BASE_ENV: Final[Mapping[str, str]] = {
    "PATH": "/opt/fluffy/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",  # noqa: S108  # the sandbox's own private /tmp (a tmpfs)
    "TMPDIR": "/tmp",  # noqa: S108
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
#: KarnEvil9's prefixes, then fluffy's.
SECRET_PREFIXES: Final = (
    *("AWS_", "AZURE_", "GCP_", "GOOGLE_", "OPENAI_", "ANTHROPIC_", "GITHUB_", "GITLAB_"),
    *("GH_", "GLAB_", "NPM_", "DOCKER_", "KUBE", "SSH_", "GPG_", "GNUPG", "VAULT_"),
    *("HF_", "HUGGING", "MISTRAL_", "COHERE_", "GEMINI_", "GROQ_", "DEEPSEEK_", "XAI_"),
    *("CLOUDFLARE_", "CF_", "DIGITALOCEAN_", "HEROKU_", "SLACK_", "STRIPE_", "TWILIO_"),
    *("SENTRY_", "DATADOG_", "DD_", "PYPI_", "TWINE_", "CARGO_REGISTRY", "FLUFFY_"),
)
#: KarnEvil9's suffixes, then fluffy's (``_URL``/``_DSN``: connection strings carry
#: passwords, e.g. DATABASE_URL, PIP_INDEX_URL).
SECRET_SUFFIXES: Final = (
    *("TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "API_KEY", "PRIVATE_KEY"),
    *("CREDENTIALS", "_KEY", "APIKEY", "PASSWD", "_PASS", "_PWD", "_AUTH", "_DSN", "_URL"),
    *("_COOKIE", "_SESSION", "_CERT", "_PEM", "_KEYS", "TOKENS", "SECRETS"),
)
#: Words (between underscores) that mark a secret anywhere in a name.
SECRET_WORDS: Final = frozenset(
    {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
    | {"APIKEY", "AUTH", "PRIVATE", "SIGNING", "BEARER", "COOKIE", "SESSION"}
)
#: Names that change what code a process loads or runs.
LOADER_NAMES: Final = frozenset(
    {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"}
    | {"PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONUSERBASE", "PYTHONSAFEPATH", "BASH_ENV"}
    | {"ENV", "PROMPT_COMMAND", "IFS", "SHELLOPTS", "NODE_OPTIONS", "PERL5OPT", "RUBYOPT"}
    | {"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_EXEC_PATH", "GIT_SSH_COMMAND"}
    | {"GCONV_PATH", "MALLOC_CONF", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN"}
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TZ = re.compile(r":?[A-Za-z0-9_+\-/.,<>]{1,64}")
MAX_VALUE_CHARS: Final = 32 * 1024
_REDACTOR: Final = Redactor()


class EnvResult(msgspec.Struct, frozen=True):
    """The sandbox environment, and the names of the ``extra`` entries dropped (why)."""

    env: dict[str, str]
    dropped: dict[str, str] = msgspec.field(default_factory=dict)

    def __repr__(self) -> str:  # values stay out of logs and tracebacks
        return f"EnvResult(env={sorted(self.env)}, dropped={self.dropped})"


def secret_name(name: str) -> bool:
    """Whether ``name`` looks like it holds a credential (case-insensitive)."""
    upper = name.upper()
    if upper.startswith(SECRET_PREFIXES) or upper.endswith(SECRET_SUFFIXES):
        return True
    return any(word in SECRET_WORDS for word in upper.split("_"))


def refusal(name: str, value: str) -> str | None:
    """Why ``extra`` may not set ``name`` (None: it may).  Never mentions the value."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return "not a plain variable name"
    upper = name.upper()
    if upper in BASE_ENV or upper == "TZ":
        return "fixed by the sandbox"
    if upper in LOADER_NAMES or upper.startswith(("LD_", "DYLD_")):
        return "changes what code programs load"
    if secret_name(name):
        return "name looks like a credential"
    if not isinstance(value, str) or "\0" in value or len(value) > MAX_VALUE_CHARS:
        return "value is not a plain string"
    if _REDACTOR.scan(value)[1]:
        return "value contains a secret"
    return None


def sandbox_environment(
    extra: Mapping[str, str] | None = None, *, source: Mapping[str, str] | None = None
) -> EnvResult:
    """The environment for a plugin sandbox (``source`` defaults to ``os.environ``)."""
    source = os.environ if source is None else source
    env = dict(BASE_ENV)
    tz = source.get("TZ")
    if isinstance(tz, str) and _TZ.fullmatch(tz):
        env["TZ"] = tz
    dropped: dict[str, str] = {}
    for name, value in (extra or {}).items():
        why = refusal(name, value)
        if why is None:
            env[name] = value
        else:
            dropped[str(name)[:128]] = why
    return EnvResult(env, dict(sorted(dropped.items())))
