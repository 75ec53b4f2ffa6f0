"""The batching inference worker, model handlers, and webhook delivery."""
