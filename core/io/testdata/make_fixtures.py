#!/usr/bin/python3
"""Writes the small checkpoint fixtures the reader tests in core/ load.

Run with a Python that has torch and numpy (Debian's: /usr/bin/python3), from anywhere:
    /usr/bin/python3 core/io/testdata/make_fixtures.py
The values are simple functions of arange so that the C++ tests can recompute them exactly.
The files are committed; rerun only to change them (the output is deterministic except for
legacy.pth, whose pickle holds random ids).
"""

import collections
import json
import os
import struct

import numpy as np
import torch

OUT = os.path.dirname(os.path.abspath(__file__))


def dtype_tensors():
    """One tensor per supported dtype, plus a 0-d and an empty tensor."""
    half_src = torch.arange(10, dtype=torch.float32) / 4 - 1
    return collections.OrderedDict([
        ("f32", torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4),
        ("f64", torch.arange(6, dtype=torch.float64).reshape(2, 3) / 8),
        ("f16", half_src.half()),
        ("bf16", half_src.bfloat16()),
        ("i64", torch.arange(-3, 5, dtype=torch.int64) * 1000000007),
        ("i32", torch.arange(-4, 4, dtype=torch.int32) * 1000),
        ("i16", torch.arange(-4, 4, dtype=torch.int16) * 100),
        ("i8", torch.arange(-4, 4, dtype=torch.int8)),
        ("u8", torch.arange(0, 256, 37, dtype=torch.uint8)),
        ("bool", torch.tensor([True, False, True, True])),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.zeros(0, 3)),
    ])


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def write_safetensors(path, tensors):
    """A safetensors writer independent of the C++ one (the safetensors package is absent)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        # Raw little-endian bytes; bfloat16 via its int16 bit pattern.
        raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        data = raw.numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    dtypes = dtype_tensors()
    torch.save(dtypes, os.path.join(OUT, "dtypes.pth"))
    # Same tensors, byte-aligned as the writer lays them out in dict order: i64 etc. follow
    # odd-sized f16 data, so some tensors are misaligned for their dtype and must be copied.
    write_safetensors(os.path.join(OUT, "dtypes.safetensors"), dtypes)

    # LitGPT-style training checkpoint: {"model": state_dict, ...} with assorted pickle types.
    model = collections.OrderedDict([
        ("w", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("b", torch.ones(3)),
    ])
    wrapped = {
        "model": model,
        "iter_num": 7,
        "step_count": 2**40,
        "neg": -5,
        "lr": 0.5,
        "flag": True,
        "nothing": None,
        "list": [1, 2, "x"],
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}},
                      "param_groups": [{"lr": 1e-3, "params": [0]}]},
    }
    torch.save(wrapped, os.path.join(OUT, "wrapped.pth"))

    # Views: tensors sharing one storage (saved once), non-contiguous and offset ones.
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = collections.OrderedDict([
        ("base", base),
        ("t", base.t()),
        ("slice", base[1:3, 2:5]),
        ("row", base[2]),
        ("flat", base.view(-1)),
        ("other_t", torch.arange(6, dtype=torch.float32).reshape(2, 3).t()),
    ])
    torch.save(views, os.path.join(OUT, "views.pth"))

    # A Parameter (torch._utils._rebuild_parameter) and protocol 4 (FRAME, MEMOIZE,
    # SHORT_BINUNICODE, STACK_GLOBAL).
    torch.save({"p": torch.nn.Parameter(torch.arange(4, dtype=torch.float32))},
               os.path.join(OUT, "parameter.pth"))
    torch.save(model, os.path.join(OUT, "proto4.pth"), pickle_protocol=4)

    # Not state dicts of the zip format: a legacy file and a bare tensor.
    torch.save(model, os.path.join(OUT, "legacy.pth"), _use_new_zipfile_serialization=False)
    torch.save(torch.ones(2), os.path.join(OUT, "bare_tensor.pth"))

    # .npy files as NumPy writes them.
    def npy(name, array, version=None):
        with open(os.path.join(OUT, name), "wb") as f:
            np.lib.format.write_array(f, array, version=version)
    npy("fortran_f4.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
    npy("v2_i2.npy", np.arange(-3, 3, dtype="<i2"), version=(2, 0))
    npy("v3_u1.npy", np.arange(0, 256, 51, dtype="|u1").reshape(2, 3), version=(3, 0))
    npy("scalar_f8.npy", np.array(2.25, dtype="<f8"))
    npy("bool.npy", np.array([[True, False], [False, True]]))
    npy("f16.npy", (np.arange(5, dtype="<f4") / 4 - 1).astype("<f2"))
    npy("i1.npy", np.arange(-4, 4, dtype="|i1"))
    npy("i4_3d.npy", np.arange(24, dtype="<i4").reshape(2, 3, 4))
    npy("empty_f4.npy", np.zeros((0, 5), dtype="<f4"))
    npy("big_endian.npy", np.arange(3, dtype=">f4"))


if __name__ == "__main__":
    main()
