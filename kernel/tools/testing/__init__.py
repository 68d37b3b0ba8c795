"""test.run: the test environment chosen, the run in its sandbox, the evidence read, the
base tree's run compared."""
