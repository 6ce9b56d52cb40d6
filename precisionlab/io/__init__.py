"""Files in and out: inputs, the one atomic way to write, tensor files, logits files and per-question task scores."""
