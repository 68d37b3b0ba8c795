"""The TDD workflow: the design's State Machine Module (states, modes, guards, evidence, budget)."""
