"""The kernel's tool path: routing, sandboxed execution and the pure pieces it is built on."""
