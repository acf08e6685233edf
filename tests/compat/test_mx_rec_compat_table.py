"""docs/MX_REC_PATHS.md (generated) is up to date, and every path and name RecSDK
imports either imports on mxrec or is refused with a RefusedImport that says why, through
each way a script reaches it (`import`, `from ... import`, attribute of its package)."""

import importlib
import subprocess
import sys

import pytest

from mxrec import compat
from mxrec.compat import table
from mxrec.compat.recsdk_imports import IMPORTS


def test_the_generated_table_is_up_to_date():
    assert table.DOC.read_text() == table.render(), (
        "docs/MX_REC_PATHS.md is out of date: run python -m mxrec.compat.table")
    assert table.main(["--check"]) == 0


def test_every_recsdk_import_resolves_or_is_refused_with_a_reason():
    states = dict(table.rows())
    assert len(states) == len(IMPORTS) + sum(
        len(names) for path, names in IMPORTS.items()
        if not states[f"`{path}`"].startswith("refused"))
    for what, state in states.items():
        assert state.startswith(("works", "a module", "is `", "refused: ")), (what, state)
        assert state != "refused: ", what


def _fresh(code: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter (a refused import must fail the first time too)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("statement, reason", [
    ("from mxrec.util.communication.hccl_mgmt import parse_hccl_json", "HCCL rank table"),
    # A refused module under an alias module imports, but every name read from it is
    # refused (Python imports the child of a module that is no package without a finder).
    ("import mxrec.util.communication.hccl_mgmt as m; m.parse_hccl_json", "HCCL rank table"),
    ("from mxrec.util.config_utils.hybrid_mgmt_utils import HybridManagerConfig",
     "HybridMgmt"),
    ("from mxrec.core.emb.sparse_embedding import HBMSparseEmbedding", "one class for every"),
    ("from mxrec.constants.constants import DataAttr", "checkpoint file layout"),
    ("from mxrec.graph import OrphanLookupKeySlicerHook", "NPUEstimator only"),
    ("import mxrec.graph.hooks", "NPUEstimator only"),
])
def test_refusals_say_why_in_a_fresh_process(statement, reason):
    done = _fresh(f"import mxrec\ntry:\n    {statement}\nexcept mxrec.compat.RefusedImport as e:"
                  "\n    print('REFUSED', e)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("REFUSED") and reason in done.stdout, done.stdout


def test_refused_names_are_import_errors_not_silent_attributes():
    import mxrec.constants.constants as constants

    with pytest.raises(ImportError, match="mx_rec's checkpoint file layout"):
        constants.DataName  # noqa: B018
    assert isinstance(compat.RefusedImport("x"), ImportError)
    # A name mxrec has nowhere is still a plain AttributeError.
    with pytest.raises(AttributeError):
        constants.NOT_A_NAME  # noqa: B018


def test_aliases_are_the_modules_themselves():
    from mxrec.util import config, env

    assert importlib.import_module("mxrec.util.config_utils.train_param") is config
    assert importlib.import_module("mxrec.util.global_env_conf") is env
    import mxrec
    from mxrec.constants.constants import SPARSE_TABLE_COLLECTION
    from mxrec.util.constants import ASCEND_GLOBAL_HASHTABLE_COLLECTION

    assert mxrec.ASCEND_GLOBAL_HASHTABLE_COLLECTION == ASCEND_GLOBAL_HASHTABLE_COLLECTION
    assert ASCEND_GLOBAL_HASHTABLE_COLLECTION == SPARSE_TABLE_COLLECTION


def test_global_env_reads_what_mxrec_reads_and_refuses_the_rest(monkeypatch):
    from mxrec.util.global_env_conf import get_global_env_conf, global_env

    monkeypatch.setenv("KEY_PROCESS_THREAD_NUM", "3")
    monkeypatch.delenv("USE_COMBINE_FAAE", raising=False)
    assert get_global_env_conf() is global_env
    assert global_env.key_process_thread_num == "3" and global_env.use_combine_faae == "0"
    with pytest.raises(AttributeError, match="set KEY_PROCESS_THREAD_NUM before init"):
        global_env.key_process_thread_num = "4"
    with pytest.raises(AttributeError, match="cm_worker_size is not available on mxrec: Ascend"):
        global_env.cm_worker_size = "8"
    with pytest.raises(AttributeError, match="tf_device is not available"):
        global_env.tf_device  # noqa: B018
    with pytest.raises(AttributeError, match="no field 'nonsense'"):
        global_env.nonsense  # noqa: B018
