"""The plugin module's errors (stable codes; what / why / fix like every fluffy error).

They belong in :mod:`fluffy.errors`' tree; they live here until that file lists them::

    ├── PluginError                   plugin.error
    │   ├── PluginManifestInvalid     plugin.manifest_invalid
    │   ├── PluginManifestYaml        plugin.manifest_yaml
    │   ├── PluginRejected            plugin.rejected
    │   ├── PluginInstallRefused      plugin.install_refused
    │   ├── PluginNotFound            plugin.not_found
    │   ├── PluginStateError          plugin.invalid_transition
    │   ├── PluginTampered            plugin.tampered
    │   ├── PluginIncompatible        plugin.api_incompatible
    │   └── PluginNotConfirmed        plugin.not_confirmed
"""

from __future__ import annotations

from fluffy.errors import FluffyError


class PluginError(FluffyError):
    code = "plugin.error"


class PluginManifestInvalid(PluginError):
    """The manifest does not match the schema; ``what`` names every field and reason."""

    code = "plugin.manifest_invalid"
    default_why = "a plugin's manifest.yaml is checked field by field before anything is installed"
    default_fix = (
        "Correct the named field(s) in the plugin's manifest.yaml "
        "(examples/plugins/lint-tool/manifest.yaml is a complete example)."
    )


class PluginManifestYaml(PluginError):
    code = "plugin.manifest_yaml"
    default_why = "manifest.yaml must be one YAML mapping (safe YAML: no tags, no aliases)"
    default_fix = "Fix the YAML syntax at the line shown."


class PluginRejected(PluginError):
    """Registration refused it (REJECTED): duplicate names, API version, reserved tags..."""

    code = "plugin.rejected"
    default_fix = (
        "Change the plugin as the reason says; `fluffy plugin list --rejected` keeps the reason."
    )


class PluginInstallRefused(PluginError):
    """The plugin folder holds something the store does not copy (links, devices, huge files)."""

    code = "plugin.install_refused"
    default_why = "the store copies plain files only, within size limits, and hashes each one"
    default_fix = "Remove the named entry from the plugin folder and install again."


class PluginNotFound(PluginError):
    code = "plugin.not_found"
    default_fix = "`fluffy plugin list` shows the installed plugins."


class PluginStateError(PluginError):
    code = "plugin.invalid_transition"
    default_why = (
        "plugins move DISCOVERED -> REGISTERED | REJECTED, REGISTERED -> LOADED -> ACTIVE -> "
        "UNLOADED, and to DISABLED (by the user, policy or a runtime error)"
    )


class PluginTampered(PluginError):
    code = "plugin.tampered"
    default_why = "a plugin's files must match the SHA-256 hashes recorded when it was installed"
    default_fix = (
        "Reinstall the plugin from its source: `fluffy plugin remove NAME`, then "
        "`fluffy plugin install PATH`."
    )


class PluginIncompatible(PluginError):
    code = "plugin.api_incompatible"
    default_fix = "Install a version of the plugin written for this kernel's syscall API."


class PluginNotConfirmed(PluginError):
    code = "plugin.not_confirmed"
    default_why = "installing a third-party plugin needs the user's review (require_review)"
    default_fix = "Run it on a terminal and answer yes, or pass --yes to confirm up front."
