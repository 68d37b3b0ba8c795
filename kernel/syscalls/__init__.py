"""The syscall layer: every method the kernel serves, one module per area, and the
wiring that builds the features behind them (``assemble_*``).

Kept apart from the features, as gVisor keeps its syscall table apart from what
implements it: a feature never imports this package (an import contract holds it), so
the features form no cycle, and the table of what the kernel answers is read here.
"""
