"""The one place that uses a private pyiceberg API. Written against pyiceberg 0.12.0.

pyiceberg has no public "write data files without committing" call; the engine needs one,
because executors write files and only the coordinator commits (two-phase). The nearest is
``pyiceberg.io.pyarrow._dataframe_to_data_files``: it bins rows into target-sized files,
splits them by the partition spec and names each file from ``write_uuid`` and a counter. A fresh
``write_uuid`` per call keeps every file name globally unique (reusing one overwrote files in a
probe and lost 41,594 of 200,000 rows). Check this module first when upgrading pyiceberg.
"""

from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata


def write_data_files(metadata: TableMetadata, io: FileIO, rows: pa.Table) -> list[DataFile]:
    """Write ``rows`` as Parquet data files of the table, partitioned; commit nothing.

    Delivery: each call writes new, uniquely named files; a retried call writes another set,
    and the files of the attempt that is not committed are orphans (removed by recovery).
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    if rows.num_rows == 0:
        return []
    return list(
        _dataframe_to_data_files(
            table_metadata=metadata,
            df=rows,
            io=io,
            write_uuid=uuid.uuid4(),
            counter=itertools.count(),
        )
    )
