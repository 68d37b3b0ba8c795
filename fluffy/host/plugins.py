"""Plugin installs: the store, the plan and the install, the wire format to the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.plugins.install import (
        InstallPlan,
        install,
        plan,
        remove,
    )
    from fluffy.kernel.plugins.manifest import read_manifest_text
    from fluffy.kernel.plugins.store import PluginStore, read_tree
    from fluffy.kernel.plugins.wire import (
        check_sendable,
        encode_files,
        tree_digest,
    )

_FROM = {
    "check_sendable": "fluffy.kernel.plugins.wire",
    "encode_files": "fluffy.kernel.plugins.wire",
    "install": "fluffy.kernel.plugins.install",
    "InstallPlan": "fluffy.kernel.plugins.install",
    "plan": "fluffy.kernel.plugins.install",
    "PluginStore": "fluffy.kernel.plugins.store",
    "read_manifest_text": "fluffy.kernel.plugins.manifest",
    "read_tree": "fluffy.kernel.plugins.store",
    "remove": "fluffy.kernel.plugins.install",
    "tree_digest": "fluffy.kernel.plugins.wire",
}
__all__ = [
    "InstallPlan",
    "PluginStore",
    "check_sendable",
    "encode_files",
    "install",
    "plan",
    "read_manifest_text",
    "read_tree",
    "remove",
    "tree_digest",
]
__getattr__ = lazy(__name__, _FROM)
