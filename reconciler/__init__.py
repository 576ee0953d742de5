"""reconciler: a Git repository as the control plane for staged rollouts.

Layers, from the inside out (see docs/architecture.md):

- pure: ``model`` (spec values), ``durations``, ``timefmt``, ``policy``,
  ``engine``, ``status`` (status values and their records). No Git, HTTP,
  clock, filesystem or randomness.
- edges: ``documents`` (YAML and schemas), ``gitstore`` (pygit2),
  ``agent_client`` (httpx), ``signing`` and ``sshsig`` (cryptography).
- programs: ``daemon``, ``agent``, ``simfleet``, ``cli`` and ``commands``.
"""

__version__ = "0.1.0"
