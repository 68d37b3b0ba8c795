"""Parse `key = value` configuration text."""


def parse_config(text: str) -> dict[str, str]:
    """Return the settings in ``text``; blank lines and `#` comments are skipped."""
    settings: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        settings[key.strip()] = value.strip()
    return settings
