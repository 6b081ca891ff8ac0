"""Exchange with other libraries' checkpoints. Only this package knows their parameter names."""
