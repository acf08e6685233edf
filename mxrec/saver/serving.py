"""Export for serving: a SavedModel whose tables are core TensorFlow lookups."""

_EXPORTING = []


def in_serving_export() -> bool:
    """True while a serving graph is being built; sparse_lookup then builds core-op lookups."""
    return bool(_EXPORTING)
