"""The L1 kernel: security policy, container manager, scheduler, audit log, state machine.

It runs as a non-root process inside the L1 container (image ``fluffy/kernel``).  Only
:mod:`fluffy.kernel.containers` talks to the container engine's socket.
"""
