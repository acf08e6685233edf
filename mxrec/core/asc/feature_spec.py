"""FeatureSpec: which batch feature feeds which table, for the FeatureSpec path.

Example:
    >>> specs = [FeatureSpec("user_ids", table_name="user_table"),
    ...          FeatureSpec("timestamp", is_timestamp=True)]
    >>> dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
"""

import dataclasses
from typing import Optional

ROWS_SUFFIX = "/mxrec_rows"
RESTORE_SUFFIX = "/mxrec_restore"
REUSED_SUFFIX = "/mxrec_reused"
BATCH_ID_SUFFIX = "/mxrec_batch_id"


@dataclasses.dataclass
class FeatureSpec:
    """One ID feature of the batch and the table it is looked up in (mx_rec's FeatureSpec).

    Attributes:
        name: the spec's name; also the batch key of the IDs unless `index_key` is given.
        table_name: the table (create_table's name) the IDs are looked up in.
        index_key: batch key of the IDs when it differs from `name`.
        access_threshold: admission threshold of the table (count an ID must reach).
        eviction_threshold: seconds of batch time after which an unseen ID is evicted.
        is_timestamp: this feature is the batch's time in seconds, not IDs.
        batch_size: rows per batch (accepted for mx_rec compatibility).
        faae_coefficient: weight of one occurrence in the admission count.
        feat_count: IDs per row (accepted for mx_rec compatibility).
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

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"FeatureSpec: name must be a non-empty string, got {self.name!r}")
        if self.is_timestamp:
            if self.table_name is not None:
                raise ValueError(f"FeatureSpec {self.name!r}: a timestamp feature has no "
                                 f"table_name, got {self.table_name!r}")
        elif not isinstance(self.table_name, str) or not self.table_name:
            raise ValueError(f"FeatureSpec {self.name!r}: table_name is required for an ID "
                             "feature")
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
    def rows_key(self) -> str:
        return self.name + ROWS_SUFFIX

    @property
    def restore_key(self) -> str:
        return self.name + RESTORE_SUFFIX

    @property
    def reused_key(self) -> str:
        return self.name + REUSED_SUFFIX

    @property
    def batch_id_key(self) -> str:
        return self.name + BATCH_ID_SUFFIX
