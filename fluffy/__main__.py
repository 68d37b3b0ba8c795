"""`python -m fluffy` is the `fluffy` command."""

from fluffy.cli.main import main

raise SystemExit(main())
