"""Sparse ("hash") optimizers for mxrec tables.

Each module mirrors mx_rec's and offers `create_hash_optimizer(...)`:
gradient_descent, adagrad, lazy_adam, ftrl, momentum. They update only the
rows a batch touched (and those rows' slots), after summing the gradients of
repeated rows.
"""
