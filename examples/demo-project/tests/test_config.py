from democonfig import parse_config


def test_reads_key_value_pairs() -> None:
    assert parse_config("name = fluffy\nmode=strict\n") == {"name": "fluffy", "mode": "strict"}


def test_skips_comments_and_blank_lines() -> None:
    assert parse_config("# settings\n\nport = 8080\n") == {"port": "8080"}


def test_value_may_contain_equals() -> None:
    assert parse_config("expr = a=b") == {"expr": "a=b"}
