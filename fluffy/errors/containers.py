"""Errors of the container engine, fluffy's images and the sandboxes run on them."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


class EngineError(FluffyError):
    code = "engine.error"
    default_why = "the container engine's socket failed at the operating-system level"
    default_fix = "Check that the engine is running (`docker info` / `podman info`), then retry."


class EngineUnavailable(EngineError):
    code = "engine.unavailable"
    retryable = True
    default_why = "fluffy needs Docker or Podman: every sandbox is a container (no fallback mode)."
    default_fix = "Run `scripts/setup`, or start the engine (e.g. `sudo systemctl start docker`)."


class EngineOperationFailed(EngineError):
    code = "engine.operation_failed"


class EngineTimeout(EngineError):
    """The engine did not answer within the time fluffy allows for the call."""

    code = "engine.timeout"
    retryable = True


class EngineNotFound(EngineError):
    """The engine has no object (container, volume, image) of that name."""

    code = "engine.not_found"
    default_why = "it was removed, or never created (a crash, or another tool cleaned up)"
    default_fix = "Retry the operation; fluffy recreates what it needs."


class ImageNotFound(EngineNotFound):
    code = "engine.image_not_found"
    default_fix = "Run `fluffy images build` to build fluffy's images locally."


class ImageError(FluffyError):
    code = "image.error"


class BaseImageUnavailable(ImageError):
    code = "image.base_unavailable"


class WheelhouseError(ImageError):
    code = "image.wheelhouse_failed"
    default_why = "Python packages are downloaded on the host, then copied into the images."
    default_fix = "Check that `pip download` works on this host (index, proxy, CA), then retry."


class ImageBuildFailed(ImageError):
    code = "image.build_failed"
    default_why = "a step of the image's Dockerfile failed in the engine's build"
    default_fix = "Run `fluffy images build --verbose` to see every step's output."


class EnvironmentFailed(ImageError):
    """A project's test environment could not be built (``fluffy env build``)."""

    code = "env.build_failed"
    default_why = (
        "the project's dependencies are downloaded on this host and installed offline into "
        "an image FROM fluffy's code-executor image"
    )
    default_fix = "Run `fluffy env build --verbose` to see each step's output."


class PackageUnavailable(EnvironmentFailed):
    """A requirement has no wheel fluffy can install offline (e.g. an sdist only)."""

    code = "env.package_unavailable"


class WheelHashMismatch(EnvironmentFailed):
    """A downloaded file is not one the project's lock file records (sha256)."""

    code = "env.hash_mismatch"


class SandboxError(FluffyError):
    code = "sandbox.error"


class SandboxRunFailed(SandboxError):
    code = "sandbox.run_failed"


class SandboxConfigError(SandboxError):
    code = "sandbox.config_invalid"
    default_why = "the sandbox's configuration breaks one of the container manager's rules"


class SandboxStateError(SandboxError):
    code = "sandbox.invalid_transition"
    default_why = "the sandbox lifecycle does not allow that step from its current state"
    default_fix = "This is a bug in fluffy; please report it with `fluffy doctor --json`."
