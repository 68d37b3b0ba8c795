"""What fluffy knows about a user's project without being told: its layout, a default
policy fitted to it, and the inputs of its test environment (dependency files)."""
