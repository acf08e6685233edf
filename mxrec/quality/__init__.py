"""What a compressed form of a model costs in quality: `python -m mxrec.quality`.

Trains a built-in model on a stream's partitions but the last (the streaming trainer, into
--model-dir), writes a serving SavedModel of it in each form compared (float32 rows, int8
rows), scores the held-out last partition with each, and prints AUC, log loss, the serving
model's size and its bytes per ID side by side (`mxrec.quality.report`).
"""
