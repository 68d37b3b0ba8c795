"""A tiny `key = value` configuration parser."""

from democonfig.config import parse_config

__all__ = ["parse_config"]
