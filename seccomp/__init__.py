"""Seccomp profiles for L2 sandboxes (strict, standard, standard-net): reviewed data,
each unusual entry with a one-line reason."""
