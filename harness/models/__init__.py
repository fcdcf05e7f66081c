"""Models from a config: loading and converting a checkpoint (loading.py) through the verified cache (cache.py), the
random shapes of the paper's backbones (shapes.py), the backends' self-check against the truth (selfcheck.py) and
each model's recorded tracer layer (tracer_layers.py). Imports results and plugins, never running or the report."""
