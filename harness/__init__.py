from harness import tracers  # noqa: F401 - registers the ${tracer:...} config resolver
