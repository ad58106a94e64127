"""mappa_train: policy-gradient algorithms and the per-agent trainer."""
