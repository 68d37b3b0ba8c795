"""The host-side `fluffy` command.  Only this package renders errors for people."""
