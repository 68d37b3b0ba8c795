"""Code that runs inside L2 sandboxes (the in-sandbox side of the IPC).

Images other than the kernel's carry only msgspec besides the standard library, so
this package may import nothing else (``tests/unit/test_layers.py``).
"""
