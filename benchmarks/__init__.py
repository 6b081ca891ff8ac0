"""Side-by-side speed comparisons: attnkit and its peer, alternately, in one process."""
