"""examples/mx_rec_zoo/gen_data.py, imported by path (examples/ is not a package)."""

import importlib.util

from zoo_support import ZOO


def load():
    spec = importlib.util.spec_from_file_location("mx_rec_zoo_gen_data", ZOO / "gen_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
