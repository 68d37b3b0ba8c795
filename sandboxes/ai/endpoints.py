"""The providers' own endpoints, used when no ``base_url`` is set.

Kept apart from the adapters (which import httpx, in the ai-provider image): the CLI on
the host reads them to say what policy.yaml must admit, with only fluffy's own
dependencies installed.
"""

from __future__ import annotations

from typing import Final

OPENAI: Final = "https://api.openai.com/v1"
ANTHROPIC: Final = "https://api.anthropic.com"
