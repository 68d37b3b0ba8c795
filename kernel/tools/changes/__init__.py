"""A session's changes: staged writes, the workspace, and the flow to review, merge and commit."""
