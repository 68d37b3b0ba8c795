"""Write the checked-in OCI profiles: ``python -m fluffy.seccomp.generate``."""

from __future__ import annotations

from pathlib import Path

from fluffy.seccomp.compile import oci_json
from fluffy.seccomp.kernel_profile import KERNEL_PROFILE
from fluffy.seccomp.rules import PROFILES

GENERATED = Path(__file__).resolve().parent / "generated"


def generated_path(profile: str) -> Path:
    """Where a profile is checked in.  L1's own lives in ``l1/``: the engine gate trusts
    every ``generated/*.json`` for sandboxes, and the kernel's profile is not one."""
    if profile == KERNEL_PROFILE:
        return GENERATED / "l1" / f"{profile}.json"
    return GENERATED / f"{profile}.json"


def main() -> int:
    (GENERATED / "l1").mkdir(parents=True, exist_ok=True)
    for profile in (*PROFILES, KERNEL_PROFILE):
        generated_path(profile).write_text(oci_json(profile))
        print(f"wrote {generated_path(profile)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
