"""Chaos tests: the real daemon, real repositories and agents on loopback,
broken on purpose (crash points, agent faults, repository faults, bad input).
``bench/reliability.py`` runs the same scenarios and prints figures."""
