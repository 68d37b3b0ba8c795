"""Calls run in L2 sandboxes: the warm pool, plugin jobs and their socket, the files sent
back, commands, the sandbox's environment."""
