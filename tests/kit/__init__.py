"""The test kit: every helper the tests share, one module per job.

Import from the module: ``from tests.kit.git import git``.

- ``ports``: loopback ports nobody else can take (``HeldPort``), and
  starting programs that cannot bind port 0 and report it;
- ``git``: real repositories driven with the `git` binary (one ``git()``);
- ``git_http``: a Git smart-HTTP server;
- ``keys``: every key a test needs, made by ``ssh-keygen`` (``make_key``);
- ``documents``: node, rollout and status files, and readers of statuses;
- ``jobs``: jobs and their signed envelopes;
- ``http``: a plain standard-library HTTP client;
- ``waiting``: waiting on a condition with a deadline;
- ``agents``: real agents and simulated fleets, as processes or in-process;
- ``fleets``: a fleet repository with its daemons and nodes;
- ``ssh``: a real OpenSSH server (and gitolite) on 127.0.0.1;
- ``endpoint``: an HTTP endpoint for the agents' http checks;
- ``webhook``: a webhook receiver for notification tests;
- ``prometheus``: a real Prometheus and an exporter it scrapes.

Shared fixtures are in ``tests/conftest.py``.
"""
