"""``reconciler VERB``: the verbs, the intent edits and the demo. Imports everything."""
