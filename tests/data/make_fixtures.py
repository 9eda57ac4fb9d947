"""Writes the NumPy fixtures the unit tests read (run with /usr/bin/python3 from this folder).

The files are committed; this script documents how they were made.
"""
import numpy as np

np.save("arange_i4.npy", np.arange(6, dtype="<i4").reshape(2, 3))
np.save("scalar_f8.npy", np.float64(2.5))
np.save("bools.npy", np.array([True, False, True]))
np.save("halfs.npy", np.array([1.0, -2.0, 0.5], dtype=np.float16))
np.save("fortran.npy", np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
np.save("big_endian.npy", np.arange(3, dtype=">i4"))
np.savez("arrays.npz", x=np.arange(4, dtype=np.float32), y=np.array([[1, 2]], dtype=np.int64))
np.savez_compressed("arrays_compressed.npz", x=np.arange(4, dtype=np.float32),
                    y=np.array([[1, 2]], dtype=np.int64))
# A dataset with a test split in the same archive (columns x and label, test/x and test/label).
np.savez("dataset.npz", x=np.arange(24, dtype=np.float32).reshape(6, 4), label=np.array([0, 1, 2, 0, 1, 2]),
         **{"test/x": np.ones((2, 4), dtype=np.float32), "test/label": np.array([1, 2])})
