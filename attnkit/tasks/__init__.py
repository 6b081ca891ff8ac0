"""The families at work, the "typical use" column of [tab:att-families]: semantic search with
an encoder's sentence embeddings (:mod:`attnkit.tasks.search`)."""
