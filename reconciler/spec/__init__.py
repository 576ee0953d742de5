"""What the fleet repository says: safe YAML, schemas, documents, repository paths,
durations and times. Imports nothing else of reconciler's."""
