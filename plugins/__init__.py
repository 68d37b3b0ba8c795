"""Built-in tool plugins and the Python plugin SDK.  Plugins never import kernel
internals (``tests/unit/repo/test_layers.py``)."""
