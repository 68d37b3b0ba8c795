"""The kernel's side of the IPC: the server and its closed method table."""
