"""The security policy engine (design: Security Policy Module).

``model`` (schema, loader with file/line/field errors), ``paths`` (confinement to the
project), ``builtin`` (the non-negotiable rules), ``tokens`` (capability tokens),
``engine`` (evaluation: built-in -> token fast path -> YAML -> extension).
"""
