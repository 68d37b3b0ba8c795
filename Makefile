# Thin wrappers; the scripts are the source of truth (CI calls scripts/test).
.PHONY: setup check test run lock
setup:
	scripts/setup
check:
	scripts/check
test:
	scripts/test
run:
	scripts/run
lock:
	.venv/bin/python -m fluffy.images.lock
