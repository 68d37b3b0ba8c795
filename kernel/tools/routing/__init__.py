"""A tool call's way through the kernel: the registry, the router and its handlers,
availability, policy, capabilities, breakers, the call's answer and its audit."""
