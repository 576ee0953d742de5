"""The reconcile pass as a frame and its steps (``loop``), the one reader
of Git (``reader``) and the engine inputs it builds (``inputs``), the
observer of agents and Prometheus (``observer``), the files a commit
writes (``status_files``), the agent client, notifications, the fleet
watch, logs and metrics. Imports everything but ``cli``."""
