"""The pure step (DESIGN.md sections 3 to 5): rule tables and the code that applies
them. No Git, HTTP, clock, file system or randomness; imports ``spec`` and ``protocol``."""
