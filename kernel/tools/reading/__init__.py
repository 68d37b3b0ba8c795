"""Reads the kernel answers itself (the fast path) and the sanitising of every tool's output."""
