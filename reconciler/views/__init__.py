"""Status for people: the status text, the dashboard and the plan. Imports ``spec``,
``protocol``, ``engine`` and ``git``."""
