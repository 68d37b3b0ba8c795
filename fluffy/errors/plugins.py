"""Errors of plugins and MCP servers."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


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


class PluginInstallDenied(PluginError):
    """The kernel refused to install: the caller is not the user's CLI, or policy denies it."""

    code = "plugin.install_denied"
    default_why = (
        "a running kernel installs plugins only for the user's CLI (its own socket), "
        "after review, and only where the policy does not deny plugin.install"
    )
    default_fix = "Install from the CLI on the host: `fluffy plugin install PATH`."


class McpError(FluffyError):
    code = "mcp.error"


class McpServerInvalid(McpError):
    """A server's registration (name, command, packages, folder or record) is refused."""

    code = "mcp.server_invalid"
    default_why = (
        "an MCP server is registered with a name, a command and where its code comes from "
        "(--pip packages or a --path folder); each is checked before anything is recorded"
    )
    default_fix = "Correct the named part and run `fluffy mcp add` again."


class McpServerNotFound(McpError):
    code = "mcp.not_found"
    default_fix = "`fluffy mcp list` shows the project's MCP servers."


class McpServerFailed(McpError):
    """The server's sandbox did not start, or the server exited or broke the protocol."""

    code = "mcp.server_failed"
    retryable = True
    default_why = "an MCP server runs in its own sandbox; the kernel restarts it on the next call"
    default_fix = (
        "Retry; if it keeps failing, check the server with `fluffy mcp list` and its "
        "command (`fluffy mcp add NAME ... -- CMD`)."
    )
