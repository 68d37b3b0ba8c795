"""The plugin module's errors: part of fluffy's one error tree (:mod:`fluffy.errors`)."""

from __future__ import annotations

from fluffy.errors import (
    PluginError,
    PluginIncompatible,
    PluginInstallDenied,
    PluginInstallRefused,
    PluginManifestInvalid,
    PluginManifestYaml,
    PluginNotConfirmed,
    PluginNotFound,
    PluginRejected,
    PluginStateError,
    PluginTampered,
)

__all__ = [
    "PluginError",
    "PluginIncompatible",
    "PluginInstallDenied",
    "PluginInstallRefused",
    "PluginManifestInvalid",
    "PluginManifestYaml",
    "PluginNotConfirmed",
    "PluginNotFound",
    "PluginRejected",
    "PluginStateError",
    "PluginTampered",
]
