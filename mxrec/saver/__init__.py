"""Checkpoints of mxrec tables.

Every table registers its host state (IDs, rows, admission counts, last-seen
times, free rows, threshold) as a saveable object, so the ordinary TF paths
(`tf.compat.v1.train.Saver`, `CheckpointSaverHook`, `MonitoredTrainingSession`,
Estimator checkpoints) save and restore it together with the device rows and
optimizer slots, which are ordinary variables.
"""
