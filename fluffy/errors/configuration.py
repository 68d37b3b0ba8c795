"""Errors of fluffy's configuration and policy files."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


class ConfigError(FluffyError):
    code = "config.invalid"
    default_fix = "Correct the named setting and run the command again."


class PolicyError(FluffyError):
    """A policy file (or a request to the policy engine) is malformed; blocks start-up."""

    code = "policy.invalid"
    default_fix = "Correct the policy file; `fluffy policy validate FILE` checks it."


class PolicyDenied(PolicyError):
    """The policy refused an operation (a rule's deny, default deny, or a review no one
    can give): the policy is fine; the operation was not allowed."""

    code = "policy.denied"
    default_fix = (
        "Do something the policy allows, or ask the user to allow it in .fluffy/policy.yaml."
    )


class BranchError(ConfigError):
    """A session on its own branch could not be made, merged or discarded."""

    code = "config.branch_failed"
