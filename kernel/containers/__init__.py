"""The container manager: engine detection, image store, sandbox runs.

The only package that talks to the container engine's socket (a layer rule that
``tests/unit/repo/test_layers.py`` enforces).
"""
