"""The reconcile pass and the loop around it, the agent client, logs and metrics.
Imports everything but ``cli``."""
