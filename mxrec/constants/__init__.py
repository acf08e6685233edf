"""Names shared by mxrec's layers (mx_rec keeps them in mx_rec/constants/constants.py)."""
