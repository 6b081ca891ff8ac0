"""bert <-> attnkit: written next."""
