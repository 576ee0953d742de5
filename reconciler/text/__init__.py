"""Status for people, made from values: the status text, the dashboard, the
plan, the fleet and eval text, notification bodies, Markdown escaping and the
web page. Imports ``spec``, ``protocol`` and ``engine``; reads no Git and no
files (``readers`` does)."""
