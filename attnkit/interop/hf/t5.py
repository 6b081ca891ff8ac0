"""t5 <-> attnkit: written next."""
