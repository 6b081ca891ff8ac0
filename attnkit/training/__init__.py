"""Training: the loop, the learning-rate schedules, checkpoints, and scale-out under torchrun."""
