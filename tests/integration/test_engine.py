from __future__ import annotations

import shutil
import subprocess

from fluffy.kernel.containers.engine import Engine


def test_connected_engine_reports_itself(engine: Engine) -> None:
    info = engine.info
    assert info.engine in ("docker", "podman")
    assert info.version and info.api_version and info.arch
    assert info.url.startswith("unix://")
    assert engine.client.ping() is True


def test_engine_version_matches_its_own_cli(engine: Engine) -> None:
    cli = shutil.which(engine.info.engine)
    if cli is None:
        return  # nothing to compare with; doctor warns about the missing CLI
    proc = subprocess.run(
        [cli, "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == engine.info.version
