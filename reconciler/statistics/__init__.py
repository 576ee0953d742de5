"""Pure statistics: numbers in, judgements out; no I/O, no clock, and none
of reconciler's other packages, so the engine and the daemon alike may use
them. (It sits outside ``engine`` only because the standard library's
``statistics`` module and SciPy load ``os`` and ``random``, which the
engine's own purity check refuses.)"""
