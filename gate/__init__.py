# The engine gate (design: L1 holds no engine socket; the trusted base is the host side).
#
# Started by the bootstrap's supervisor, it serves L1 a filtered engine API on a socket in
# a folder L1 sees read-only: only the operations the kernel uses, only on containers
# carrying the project's label, and a container create accepted only when it is fluffy's
# hardened sandbox template.  Beside it, its dialler (:mod:`.net`) is L1's only way out:
# L1 has no network, and the dialler connects only to allow-listed targets.  Standard
# library only, under its own 500-line budget (``tests/unit/repo/test_layers.py``); see
# docs/SECURITY.md for what it stops.
