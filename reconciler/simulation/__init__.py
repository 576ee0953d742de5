"""The simulated fleet: many scripted node agents behind one port, for
``reconciler sim-fleet``, the demo, the tests and the benchmarks. Not part of
a node or the daemon: nothing in the product imports it. It speaks the agent
protocol over the node side's HTTP server, with the real admission checks."""
