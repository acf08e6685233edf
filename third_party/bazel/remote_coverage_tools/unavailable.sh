#!/bin/sh
echo "bazel coverage is not available in mxrec's offline Bazel build (see //:WORKSPACE)" >&2
exit 1
