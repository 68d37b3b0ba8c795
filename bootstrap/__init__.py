"""The host-side trust anchor (design: Bootstrap Layer).

Standard library only, under 500 lines of code in total: it reads configuration, finds
the container engine, starts the L1 kernel container, health-checks it and restarts it
on crash.  ``tests/unit/repo/test_layers.py`` enforces both limits.
"""
