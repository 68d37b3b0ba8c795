"""The host-side trust anchor (design: Bootstrap Layer): standard library only, under 500
lines of code (``tests/unit/repo/test_layers.py``); finds the engine, starts the L1 kernel
container, health-checks it and restarts it on crash."""
