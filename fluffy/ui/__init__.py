"""`fluffy ui`: a local web view of a project's sessions, reviews, audit log and policy.

A host-side process (the kernel keeps no network): it reads the project's state through
the kernel's CLI socket and its audit database, and serves pages on 127.0.0.1 only, to
a browser holding the per-launch token (see :mod:`fluffy.ui.app`).
"""
