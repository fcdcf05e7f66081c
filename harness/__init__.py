from harness.models import tracer_layers  # noqa: F401 - registers the ${tracer:...} config resolver
