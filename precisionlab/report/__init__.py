"""The only place that prints: the console toolkit, the JSON envelope, plots, one renderer per command."""
