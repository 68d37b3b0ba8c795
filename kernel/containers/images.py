"""Image operations on the engine: look up, pull, import, build, list, remove."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fluffy.errors import EngineError, EngineNotFound, ImageBuildFailed
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.errors import engine_call

#: Build output lines look like "Step 3/9 : RUN ..." (legacy builder, Docker and Podman).
_STEP = re.compile(r"^(?:Step|STEP) (\d+)/(\d+)\s*:?\s*(.*)$")
#: A build that fails because an image it reused is gone (Docker, Podman).
_VANISHED = re.compile(r"(?i)no such image|image not known|failed to get digest")
#: The image a build step made: " ---> 0123abcd" (Docker's legacy builder), "--> 0123abcd"
#: (Podman).  One it reused is another build's: Docker says " ---> Using cache" on the
#: line before its ID, Podman "--> Using cache 0123abcd..." (not matched).
_STEP_IMAGE = re.compile(r"^\s*-{2,3}> ([0-9a-f]{10,64})$")
_REUSED = re.compile(r"^\s*-{2,3}> Using cache$")


class ImageStore:
    """The images of one engine."""

    def __init__(self, engine: Engine) -> None:
        self._api = engine.client.api
        self.engine = engine
        #: The step images this store's builds made, not reused (short IDs): the ones
        #: :meth:`prune_dangling` may remove, never another process's build in progress.
        self.steps: set[str] = set()

    def image_id(self, ref: str) -> str | None:
        """The image's ID, or None if the engine does not have it."""
        try:
            return str(self.inspect(ref)["Id"])
        except EngineNotFound:
            return None

    def inspect(self, ref: str) -> dict[str, Any]:
        with engine_call(f"inspect image {ref}"):
            data: dict[str, Any] = self._api.inspect_image(ref)  # type: ignore[no-untyped-call]
        return data

    def pull(self, ref: str) -> None:
        repository, _, tag = ref.partition(":")
        with engine_call(f"pull {ref}"):
            self._api.pull(repository, tag=tag or "latest")

    def save(self, ref: str, sink: BinaryIO) -> None:
        """Write ``ref`` as an image archive (``docker save``) to ``sink``."""
        with engine_call(f"save image {ref}"):
            for chunk in self._api.get_image(ref):
                sink.write(chunk)

    def load(self, source: BinaryIO) -> None:
        """Load an image archive (``docker load``)."""
        with engine_call("load an image archive"):
            for _ in self._api.load_image(source):  # type: ignore[no-untyped-call]
                pass

    def import_rootfs(self, archive: Path, ref: str, *, source: str) -> None:
        repository, _, tag = ref.partition(":")
        with engine_call(f"import {archive} as {ref}"):
            self._api.import_image_from_file(
                str(archive),
                repository=repository,
                tag=tag or "latest",
                changes=[f'LABEL org.fluffy.base-source="{source}"', 'CMD ["/bin/bash"]'],
            )

    def build(
        self,
        context: Path,
        tag: str,
        *,
        buildargs: dict[str, str],
        labels: dict[str, str],
        on_line: Callable[[str], None],
        on_step: Callable[[int, int, str], None],
        network_mode: str | None = None,
    ) -> str:
        """Build ``context`` as ``tag``; stream output; return the image ID.

        ``network_mode="none"``: the build's steps have no network (a project's
        environment installs only what the host downloaded)."""
        for attempt in (1, 2):
            image_id, error, last_lines = self._build_once(
                context, tag, buildargs, labels, on_line, on_step, network_mode
            )
            if error is None or attempt == 2 or not _VANISHED.search(error):
                break
            # A cached step's image was removed while this build used it (a prune by
            # another process): the next attempt no longer finds it in the cache.
            on_line(f"an image this build reused was removed meanwhile ({error}): again")
        if error is not None:
            raise ImageBuildFailed(
                f"cannot build {tag}: {error}",
                why="the engine's build stopped; last output:\n" + "\n".join(last_lines),
                fix="Fix the failing step (network to the Debian mirror, a lock that pins a "
                "wheel missing for this platform), then run `fluffy images build` again.",
            )
        return image_id or self.image_id(tag) or ""

    def _build_once(
        self,
        context: Path,
        tag: str,
        buildargs: dict[str, str],
        labels: dict[str, str],
        on_line: Callable[[str], None],
        on_step: Callable[[int, int, str], None],
        network_mode: str | None,
    ) -> tuple[str | None, str | None, list[str]]:
        """One build: (image ID, the engine's error, the last lines of output)."""
        last_lines: list[str] = []
        reused = False  # the last line said the next ID is a cached step's
        image_id: str | None = None
        error: str | None = None
        with engine_call(f"build {tag}"):
            stream: Iterator[dict[str, Any]] = self._api.build(
                path=str(context),
                tag=tag,
                buildargs=buildargs,
                labels=labels,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode=network_mode,
            )
            for chunk in stream:  # read to the end even after an error: frees the connection
                if "error" in chunk:
                    error = error or str(chunk.get("error", "")).strip()
                    continue
                aux = chunk.get("aux")
                if isinstance(aux, dict) and "ID" in aux:
                    image_id = str(aux["ID"])
                text = str(chunk.get("stream", ""))
                for line in text.splitlines():
                    line = line.rstrip()
                    if not line:
                        continue
                    last_lines = [*last_lines[-14:], line]
                    match = _STEP.match(line)
                    if match:
                        on_step(int(match[1]), int(match[2]), match[3])
                    made = _STEP_IMAGE.match(line)
                    if made and not reused:
                        self.steps.add(made[1])
                    reused = _REUSED.match(line) is not None
                    on_line(line)
        return image_id, error, last_lines

    def list_by_label(self, label: str) -> list[dict[str, Any]]:
        with engine_call(f"list images labelled {label}"):
            images: list[dict[str, Any]] = self._api.images(filters={"label": label})
        return images

    def prune_dangling(self, label: str, *, everyone: bool = False) -> None:
        """Remove untagged images carrying ``label`` that this store's builds made (their
        intermediate stages), or with ``everyone`` all of them (``fluffy images prune``).
        Another process's build in progress has untagged steps too: removing them made
        it fail.  One in use by a container stays (Podman refuses the whole prune for
        it: then each image is removed on its own, and the ones in use are left)."""
        if not everyone:
            if self.steps:
                self._remove_untagged(label, own=True)
            return
        try:
            with engine_call(f"prune untagged images labelled {label}"):
                self._api.prune_images(filters={"dangling": True, "label": label})  # type: ignore[no-untyped-call]
            return
        except EngineError:
            self._remove_untagged(label, own=False)

    def _remove_untagged(self, label: str, *, own: bool) -> None:
        """Each untagged image carrying ``label`` removed on its own (``own``: only the
        steps this store's builds made); one in use, or a later step's parent, stays for a
        later prune."""
        with engine_call(f"list untagged images labelled {label}"):
            listed: list[dict[str, Any]] = self._api.images(
                filters={"dangling": True, "label": label}
            )
        for image in listed:
            found = str(image.get("Id", "")).removeprefix("sha256:")
            if own and not any(found.startswith(step) for step in self.steps):
                continue
            try:
                with engine_call(f"remove untagged image {found[:12]}"):
                    self._api.remove_image(found)
            except EngineError:
                continue

    def remove(self, ref: str) -> None:
        with engine_call(f"remove image {ref}"):
            self._api.remove_image(ref)
