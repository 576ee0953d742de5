"""Evidence a person can check offline: deployment attestations (built,
signed and checked) and the check of a rollout's recorded evidence. Imports
``spec``, ``protocol``, ``engine``, ``git`` and ``readers``."""
