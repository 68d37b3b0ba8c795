"""Load a profile into this process with libseccomp, then run probe cases.

``python -m fluffy.sandboxes.seccomp_trial PROFILE CASE ...`` prints the probe's JSON.
The fast tests run it as a child process on the host: the same rules the engine gets as
OCI JSON, compiled by libseccomp here, judged by the same probe the escape suite runs in
real containers.  It lives beside the probe (and ``tighten``, which loads a filter the
same way) so that ``fluffy.seccomp`` builds profiles and never imports sandbox code.
"""

from __future__ import annotations

import json
import sys

from fluffy.sandboxes import probe
from fluffy.seccomp.compile import build_filter


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m fluffy.sandboxes.seccomp_trial PROFILE [CASE ...]", file=sys.stderr)
        return 2
    build_filter(args[0]).load()
    print(json.dumps(probe.run(args[1:])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
