"""vec.compact_blobs cuts one buffer into rows (issue 22: per-row tobytes was most of
`embed --pending`'s own work): each blob must be the row's int8 bytes then its scale, exactly."""

from __future__ import annotations

import numpy as np

from llmem.db import vec


def test_each_blob_is_its_rows_int8_bytes_then_its_little_endian_scale():
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((37, 24)).astype(np.float32)
    rows[3] = 0.0  # a zero row stays zero, with its scale
    blobs = vec.compact_blobs(rows)
    ints, scales = vec.quantize(rows)
    assert blobs == [ints[i].tobytes() + np.float32(scales[i]).astype("<f4").tobytes() for i in range(37)]
    assert all(len(blob) == 28 for blob in blobs)
    assert np.allclose(vec.decode_rows(blobs, 24), ints.astype(np.float32) * scales[:, None])
    assert vec.compact_blobs(rows[5]) == [blobs[5]]  # one vector, not a matrix
    assert vec.compact_blobs(np.empty((0, 24), np.float32)) == []
