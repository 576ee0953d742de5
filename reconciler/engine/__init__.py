"""The pure step (docs/rollouts.md): rule tables and the code that applies
them. No Git, HTTP, clock, file system or randomness; imports ``spec`` and ``protocol``."""
