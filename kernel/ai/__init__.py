"""The kernel's side of the AI conversation: token estimates, context windows, persistence."""
