"""The chapter itself: its labels, and (in later modules) its figures and experiments."""

# In the chapter's order; each names a module of attnkit.chapter with run(ctx) -> Section
# (attnkit.chapter.figures runs them). Here, torch-free, for the command line's --help.
EXPERIMENTS: tuple[str, ...] = (
    "flow", "variance", "positions", "masking", "heads", "complexity", "prenorm", "families", "transfer",
)  # fmt: skip
