"""Engines: the embedded model, Hugging Face models, the modules --layers watches and the perturbations --inject plants."""
