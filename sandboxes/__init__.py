"""Code that runs inside L2 sandboxes (the in-sandbox side of the IPC).

L2 images carry only the standard library, msgspec, pyseccomp and the in-sandbox parts
of fluffy (``images.spec.SANDBOX_PARTS``), so this package may import nothing else
(``tests/unit/repo/test_layers.py``).
"""
