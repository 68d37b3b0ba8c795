"""The tamper-evident audit log (the design's Audit Log Module) on chained-hash SQLite."""
