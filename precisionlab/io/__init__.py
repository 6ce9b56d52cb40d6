"""Files in and out: inputs, the one atomic way to write, tensor files and logits files."""
