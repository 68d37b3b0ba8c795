"""fluffy: a zero-trust AI coding workstation.

The import package ``fluffy`` is the only top-level name fluffy installs.  The design's
top-level directories are its subpackages (docs/decisions.md, ADR-001)::

    fluffy.bootstrap   host trust anchor, stdlib only        (bootstrap/)
    fluffy.kernel      the L1 kernel and its five modules    (kernel/)
    fluffy.sandboxes   code that runs inside L2 sandboxes    (sandboxes/)
    fluffy.seccomp     seccomp profiles, reviewed data       (seccomp/)
    fluffy.plugins     built-in plugins and the plugin SDK   (plugins/)
    fluffy.images      image definitions and the builder     (images/)
    fluffy.cli         the host-side `fluffy` command
"""

from fluffy._version import __version__

__all__ = ["__version__"]
