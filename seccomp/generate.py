"""Write the checked-in OCI profiles: ``python -m fluffy.seccomp.generate``."""

from __future__ import annotations

from pathlib import Path

from fluffy.seccomp.compile import oci_json
from fluffy.seccomp.rules import PROFILES

GENERATED = Path(__file__).resolve().parent / "generated"


def generated_path(profile: str) -> Path:
    return GENERATED / f"{profile}.json"


def main() -> int:
    GENERATED.mkdir(exist_ok=True)
    for profile in PROFILES:
        generated_path(profile).write_text(oci_json(profile))
        print(f"wrote {generated_path(profile)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
