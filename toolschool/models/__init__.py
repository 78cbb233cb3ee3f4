"""Models: naming (spec), the embedded default, loading, device/dtype, and (later) generation backends."""
