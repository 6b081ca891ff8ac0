"""The four pretraining objectives of [tab:att-families] (and translation, the paper's task):
each turns token sequences into a batch and a batch into a loss."""
