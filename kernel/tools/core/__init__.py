"""The pieces every part of the tool path shares: the tool registry, a routed call and
its capability tokens."""
