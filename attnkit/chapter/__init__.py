"""The chapter itself: its labels, and (in later modules) its figures and experiments."""
