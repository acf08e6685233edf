"""`custom_gradient`: `tf.custom_gradient` for graph mode, without keeping the graph alive.

In graph mode `tf.custom_gradient` registers each use's gradient function in TensorFlow's
process-wide gradient registry under a fresh name. The registry never forgets it, and the
function's closure holds tensors of its graph, so a graph that used it is never freed (plain
TensorFlow too: an Estimator's every `train`/`evaluate` graph stays). Here one gradient
function is registered once, and each use's own gradient function is kept on its graph (an
attribute dropped with the graph), found by the op's name.

Inside a `tf.function` or eagerly (where gradient tapes record the call) it is
`tf.custom_gradient` itself.
"""

import functools

import tensorflow as tf

_NAME = "MxrecCustomGradient"
_ATTRIBUTE = "_mxrec_custom_gradients"


@tf.RegisterGradient(_NAME)
def _dispatch(op, *grads):
    functions = getattr(op.graph, _ATTRIBUTE, {})
    if op.name not in functions:
        raise LookupError(f"op {op.name!r}: its custom gradient was registered in another graph "
                          "(mxrec.util.gradients.custom_gradient)")
    # IdentityN([y, x]): no gradient through y's own computation, grad(dy) to x.
    return [None, functions[op.name](grads[0])]


def custom_gradient(f):
    """Decorates f(x) -> (y, grad), grad(dy) -> dx, for one tensor x, like tf.custom_gradient."""

    @functools.wraps(f)
    def decorated(x):
        if tf.executing_eagerly() or tf.inside_function():
            return tf.custom_gradient(f)(x)
        x = tf.convert_to_tensor(x)
        y, grad = f(x)
        graph = tf.compat.v1.get_default_graph()
        with graph.gradient_override_map({"IdentityN": _NAME}):
            out, _ = tf.identity_n([y, x])
        functions = getattr(graph, _ATTRIBUTE, None)
        if functions is None:
            functions = {}
            setattr(graph, _ATTRIBUTE, functions)
        functions[out.op.name] = grad
        return out

    return decorated
