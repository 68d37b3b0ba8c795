"""AI provider adapters and the ai-provider sandbox's network plumbing.

Everything here runs inside the ai-provider L2 sandbox (strict seccomp, no network but
the kernel's CONNECT proxy), so it needs only the image's packages: msgspec and httpx.
It never imports ``fluffy.kernel``.
"""
