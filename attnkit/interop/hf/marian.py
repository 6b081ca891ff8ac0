"""marian <-> attnkit: written next."""
