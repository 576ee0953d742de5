"""The node side: the agent, its state directory and its HTTP server (which the
simulated fleet, in ``reconciler.simulation``, serves over too). Imports
``spec`` and ``protocol``; never the engine, ``git`` or the daemon."""
