"""Benchmarks: ``python -m benchmarks.<area> --json`` prints one JSON object, each figure
beside a baseline measured in the same run."""
