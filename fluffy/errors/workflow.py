"""Errors of the TDD state machine."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


class WorkflowError(FluffyError):
    """The TDD state machine refused something."""

    code = "workflow.error"


class TransitionDenied(WorkflowError):
    code = "workflow.transition_denied"
    default_why = "the workflow's guard for this transition does not hold"


class ExemptionDenied(WorkflowError):
    code = "workflow.exemption_denied"
    default_why = "the paths do not all match the category's tdd_exemptions globs in policy.yaml"
    default_fix = "Follow the normal TDD flow, or ask for the category whose globs match."


class ExemptionPending(ExemptionDenied):
    code = "workflow.exemption_pending"
    default_why = (
        "one exemption request waits at a time, so the user decides on the request they "
        "were shown and no later request can take its place"
    )
    default_fix = "Wait for the user's answer to the request that waits, then ask again."


class ExemptionMismatch(ExemptionDenied):
    code = "workflow.exemption_mismatch"
    default_why = "a decision names the request it answers, and another request waits"
    default_fix = "Look at the request that waits and decide on it by its id."


class ModeDenied(WorkflowError):
    code = "workflow.mode_denied"
    default_why = "the policy engine did not allow the mode change"


class SessionNotFound(WorkflowError):
    code = "workflow.session_not_found"
    default_fix = "List sessions with `fluffy session list`."


class EvidenceError(WorkflowError):
    code = "workflow.evidence_invalid"
    default_why = "a test run's report could not be read"
    default_fix = "Run the tests again through test.run."


class ForgedEvidence(EvidenceError):
    """A test run reported as passed a test that must fail (its canary)."""

    code = "workflow.evidence_forged"
    default_why = "code in the test run rewrites test outcomes"


class CoverageFormatError(WorkflowError):
    code = "workflow.coverage_invalid"
    default_why = "the coverage report is not coverage.py JSON, Cobertura XML or lcov"
    default_fix = "Produce coverage with `pytest --cov --cov-report=json` (or xml / lcov)."
