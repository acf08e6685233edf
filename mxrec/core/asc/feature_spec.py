"""FeatureSpec: which batch feature feeds which table, for the FeatureSpec path.

Example:
    >>> specs = [FeatureSpec("user_ids", table_name="user_table"),
    ...          FeatureSpec("timestamp", is_timestamp=True)]
    >>> dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
"""

import dataclasses
import itertools
from typing import Optional

ROWS_SUFFIX = "/mxrec_rows"
RESTORE_SUFFIX = "/mxrec_restore"
REUSED_SUFFIX = "/mxrec_reused"
BATCH_ID_SUFFIX = "/mxrec_batch_id"
# Several ranks: the batch was checked by an insert function of this mode; its batch time.
CHECKED_SUFFIXES = {True: "/mxrec_checked_train", False: "/mxrec_checked_eval"}
TIME_SUFFIX = "/mxrec_time"
_SERIALS = itertools.count()


@dataclasses.dataclass(eq=False)
class FeatureSpec:
    """One ID feature of the batch and the table it is looked up in (mx_rec's FeatureSpec).

    Each instance is one lookup: several specs may name the same feature and table
    (mx_rec's multi-lookup, one table looked up several times in a step); each plans its
    own copy of the IDs, and `sparse_lookup(table, spec, batch=...)` reads that spec's plan.
    Specs compare by identity.

    Attributes:
        name: the spec's name (set_threshold's ids_name); also the batch key of the IDs
            unless `index_key` is given.
        table_name: the table (create_table's name) the IDs are looked up in; `name` when
            not given, as in mx_rec.
        index_key: batch key of the IDs when it differs from `name`.
        access_threshold: admission threshold of the table (count an ID must reach).
        eviction_threshold: seconds of batch time after which an unseen ID is evicted.
        is_timestamp: this feature is the batch's time in seconds, not IDs.
        batch_size: rows per batch; when given, a batch with another first dimension is an
            error (get_asc_insert_func checks each batch).
        faae_coefficient: weight of one occurrence in the admission count.
        feat_count: IDs per row; when given, a batch with another count per row (the product
            of the dimensions after the first) is an error.
    """

    name: str
    table_name: Optional[str] = None
    index_key: Optional[str] = None
    access_threshold: Optional[float] = None
    eviction_threshold: Optional[int] = None
    is_timestamp: Optional[bool] = None
    batch_size: Optional[int] = None
    faae_coefficient: float = 1
    feat_count: Optional[int] = None
    serial: int = dataclasses.field(init=False, repr=False,
                                    default_factory=lambda: next(_SERIALS))

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"FeatureSpec: name must be a non-empty string, got {self.name!r}")
        if self.is_timestamp:
            if self.table_name is not None:
                raise ValueError(f"FeatureSpec {self.name!r}: a timestamp feature has no "
                                 f"table_name, got {self.table_name!r}")
        elif self.table_name is None:
            self.table_name = self.name  # mx_rec: the table named like the feature
        elif not isinstance(self.table_name, str) or not self.table_name:
            raise ValueError(f"FeatureSpec {self.name!r}: table_name must be a non-empty "
                             f"string, got {self.table_name!r}")
        if self.index_key is not None and not isinstance(self.index_key, str):
            raise NotImplementedError(
                f"FeatureSpec {self.name!r}: index_key={self.index_key!r} (mx_rec's position in "
                "a tuple batch) is not available; batches are dicts of features, so name the "
                "feature's key")
        if self.eviction_threshold is not None and self.access_threshold is None:
            raise ValueError(f"FeatureSpec {self.name!r}: eviction_threshold needs "
                             "access_threshold")
        for field in ("access_threshold", "eviction_threshold", "batch_size", "feat_count"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"FeatureSpec {self.name!r}: {field} must be >= 0, got {value!r}")
        if isinstance(self.faae_coefficient, bool) or self.faae_coefficient <= 0:
            raise ValueError(f"FeatureSpec {self.name!r}: faae_coefficient must be > 0, got "
                             f"{self.faae_coefficient!r}")

    @property
    def ids_key(self) -> str:
        """The batch key of the IDs."""
        return self.index_key or self.name

    @property
    def _plan_prefix(self) -> str:
        # The instance's serial keeps the plans of specs with the same name apart.
        return f"{self.name}/{self.serial}"

    @property
    def rows_key(self) -> str:
        return self._plan_prefix + ROWS_SUFFIX

    @property
    def restore_key(self) -> str:
        return self._plan_prefix + RESTORE_SUFFIX

    @property
    def reused_key(self) -> str:
        return self._plan_prefix + REUSED_SUFFIX

    @property
    def batch_id_key(self) -> str:
        return self._plan_prefix + BATCH_ID_SUFFIX

    def checked_key(self, is_training: bool) -> str:
        """Several ranks: the batch key that says an insert function of this mode (is_training)
        checked the spec's IDs (the plan is made in the step)."""
        return self._plan_prefix + CHECKED_SUFFIXES[is_training]

    @property
    def time_key(self) -> str:
        """Several ranks: the batch key of the batch's time (the timestamp spec's maximum)."""
        return self._plan_prefix + TIME_SUFFIX
