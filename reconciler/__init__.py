"""reconciler: a Git repository as the control plane for staged rollouts.

The packages, from the bottom up (docs/architecture.md says what each may
import; ``lint-imports`` checks it):

- ``statistics``: pure statistics (the comparisons' tests); imports nothing of
  ours, so the engine and the daemon alike may use it.
- ``spec``: what the repository says: safe YAML, schemas, documents, paths,
  status records. Pure values and parsing.
- ``protocol``: what the daemon and agents say: job payloads and ids,
  signing, admission checks, observations, signed answers.
- ``engine``: the pure step and its rule tables. No Git, HTTP, clock,
  filesystem or randomness.
- ``git``: the only pygit2 user: store, history, branch watch, signatures.
- ``node``: the node side: the agent, its state directory and its HTTP server.
- ``simulation``: the simulated fleet, for ``sim-fleet``, the demo, tests and
  benchmarks; nothing in the product imports it.
- ``readers``: the readers of the status branch (rollout and fleet status).
- ``text``: for people: status text, dashboard, plan, the web page; values in,
  text out.
- ``attestations``: deployment attestations and the offline evidence check.
- ``daemon``: the reconcile pass and the loop around it, the agent client,
  the fleet watch, notifications, metrics.
- ``cli``: ``reconciler VERB``, one module per verb under ``cli.commands``.
"""

# Versions 1 to 3 are released (CHANGELOG.md); pyproject.toml reads it from here.
__version__ = "3.0.0"
