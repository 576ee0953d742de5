"""What the daemon and the node agents say to each other: job payloads, ids,
signatures, admission checks and observations. Imports only ``spec``."""
