"""The memory estimates of runtime/memory.py for a model named as a command
names it (None: the embedded model, or a Hugging Face folder), through
engines/shape.model_shape: what the tests compare measured peaks with. Only
the tests ask for an estimate by model name; the commands hold the shape."""

from precisionlab.engines.shape import model_shape
from precisionlab.runtime import memory


def compare_model_for(model: str | None, steps: int, prompt: str) -> int:
    """memory.compare_model for the model; 0 where none is found."""
    shape = model_shape(model, steps, prompt)
    return 0 if shape is None else memory.compare_model(shape)


def compare_layers_for(model: str | None, steps: int, prompt: str, dump: bool = False) -> int:
    """memory.compare_layers for the model; 0 where none is found."""
    shape = model_shape(model, steps, prompt)
    return 0 if shape is None else memory.compare_layers(shape, dump=dump)


def compare_engine_layers_for(yours: str | None, ref: str | None, steps: int, prompt: str, lows: int = 2) -> int:
    """memory.compare_layers_pair for the two models (REF's shape at the run's length); 0 where one is not found."""
    r, y = model_shape(ref, steps, prompt), model_shape(yours, steps, prompt)
    return 0 if r is None or y is None else memory.compare_layers_pair(r, y, lows)


def kvcache_for(model: str | None, steps: int, prompt: str, calibration: int) -> int:
    """memory.kvcache for the model; 0 where none is found."""
    shape = model_shape(model, steps, prompt)
    return 0 if shape is None else memory.kvcache(shape, calibration)
