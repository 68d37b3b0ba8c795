"""`python -m fluffy` is the `fluffy` command."""

from fluffy.cli.main import command

raise SystemExit(command())
