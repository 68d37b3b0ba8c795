"""Seccomp profiles for L2 sandboxes (strict, standard, standard-net) and for the L1
kernel itself (kernel): reviewed data, each unusual entry with a one-line reason."""
