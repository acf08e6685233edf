"""mxrec: embedding offload for TensorFlow recommendation models.

Module paths mirror Huawei's mx_rec, so that `import mx_rec` becomes
`import mxrec`:

    from mxrec.util.initialize import init, terminate_config_initializer
    from mxrec.core.embedding import create_table, sparse_lookup
    from mxrec.optimizers.lazy_adam import create_hash_optimizer
    from mxrec.util.variable import get_dense_and_sparse_variable

mx_rec's paths that are not modules of ours (`mxrec.util.initialize` is `mxrec.initialize`,
...) are defined in `mxrec.compat`, installed here.
"""

from mxrec import compat

__version__ = "0.1.0"

compat.install()
