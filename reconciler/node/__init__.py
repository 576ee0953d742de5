"""The node side: the agent, its state directory, the simulated fleet and their HTTP
server. Imports ``spec`` and ``protocol``; never the engine, ``git`` or the daemon."""
