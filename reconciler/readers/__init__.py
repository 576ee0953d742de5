"""The readers of the status branch: rollout status files and the fleet
status, schema-checked and read once per blob. Imports ``spec`` and ``git``;
decides nothing and renders nothing."""
