"""fluffy's IPC: length-prefixed JSON over Unix sockets (docs/ipc.md).

``protocol`` (frames and messages), ``transport`` (peer identity), ``client`` (async and
sync clients).  The kernel's server is :mod:`fluffy.kernel.ipc`.  This package runs in
L2 sandboxes too: standard library and msgspec only.
"""
