"""The only importer of pygit2: the store, history, branch watch, approval and SSH
signatures. Imports only ``spec``."""
