// Reads PyTorch checkpoints written by Python's torch.save(state_dict) (the zip format of
// PyTorch >= 1.6), such as LitGPT's lit_model.pth. LibTorch's own torch::pickle_load cannot
// read LitGPT's OrderedDict-with-_metadata state dicts, so this has its own zip reader and an
// interpreter for the subset of pickle that torch.save emits for (nested) dicts of tensors.
#ifndef LGPT_CORE_IO_TORCH_PICKLE_H_
#define LGPT_CORE_IO_TORCH_PICKLE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// Reads the state dict saved in `path` as CPU tensors, whatever device they were saved from.
//
// The top-level object must be a dict (plain or OrderedDict) of str -> tensor, or a dict
// whose "model" entry is such a dict (LitGPT's {"model": state_dict, ...} training
// checkpoints; the other entries are parsed but ignored, as LitGPT's
// `state_dict.get("model", state_dict)` does). Non-string keys or non-tensor values in the
// state dict are errors.
//
// Tensors come back as torch.load returns them: views (as_strided) into their storages, so
// tensors that shared a storage when saved still share it, and a tensor saved
// non-contiguous stays non-contiguous. Storages are zero-copy views of the file, mapped
// private and copy-on-write (see MappedFile), unless the record is misaligned for its dtype
// or holds bools (normalised to 0/1); those are copied. requires_grad and backward hooks are
// dropped.
//
// Supported: pickle protocols 2 to 5 as torch.save writes them (opcodes PROTO FRAME STOP MARK
// POP POP_MARK DUP NONE NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1 LONG4 BINFLOAT
// BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_TUPLE TUPLE
// TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST LIST APPEND APPENDS EMPTY_DICT DICT SETITEM SETITEMS
// GLOBAL STACK_GLOBAL REDUCE NEWOBJ BUILD BINPERSID BINPUT LONG_BINPUT MEMOIZE BINGET
// LONG_BINGET); globals collections.OrderedDict, torch._utils._rebuild_tensor,
// _rebuild_tensor_v2, _rebuild_parameter, _rebuild_parameter_with_state, and the storage
// types torch.{Double,Float,Half,BFloat16,Long,Int,Short,Char,Byte,Bool}Storage; the zip
// records <archive>/data.pkl, <archive>/data/<key> and <archive>/byteorder (little only).
// Stored (uncompressed) zip entries, zip64 included.
//
// With `verify_checksums` (the default), the records read are checked against the CRC-32s
// of the zip's central directory: data.pkl and byteorder before the pickle is interpreted,
// and after it the storage records behind the returned tensors (each once; storages only
// other entries of a training checkpoint use are not read, so not checked). Loading stays
// zero-copy. The check is one read of the weights, in 1 MiB pieces over as many threads as
// LibTorch's intra-op setting: ~35 ms of CPU for the 444 MB 110M-parameter checkpoint
// (crc32.h, ~13 GB/s a core with carry-less multiplication), plus the page faults of first
// touching the mapping, moved here from the first reader of the tensors (README.md, "Bad
// input", has load times). A file whose records all store CRC 0 was written without
// checksums (PyTorch's torch.serialization.set_crc32_options(False)) and is not checked.
//
// Hostile input yields errors, never crashes or unbounded work: data.pkl is capped at
// 64 MiB, the interpreter at 1M objects (about 80k tensors' worth; ~250 MB at worst), 1M memo
// entries, a value stack of 1M entries and 1000 nested MARKs; every storage record must be
// exactly numel * element size bytes and every tensor view must lie within its storage
// (overflow-checked). Work is O(n log n) in the pickle size (dict keys are interned once each).
//
// Errors: NotFound / PermissionDenied / FailedPrecondition for a path that cannot be opened
// or is not a regular file; InvalidArgument for a malformed zip, pickle or state dict
// (naming the opcode and its offset, or the global, or the key); Unimplemented for files
// that are valid but outside the subset (legacy pre-1.6 torch.save files, compressed
// entries, big-endian data, other globals); DataLoss for a record that fails its CRC-32
// check, naming the record and the tensors it holds ("record archive/data/3 (tensor
// transformer.h.0.attn.qkv.weight) fails its CRC-32 check (stored 0x..., computed 0x...)").
// Messages name the path.
absl::StatusOr<TensorMap> ReadTorchStateDict(const std::string& path,
                                             bool verify_checksums = true);

// For APIs over ReadTorchStateDict that expose verify_checksums under their own name
// (`option`, e.g. "LoadOptions.verify_checksums"): a failed check (DataLoss) gains "; set
// <option> = false to load it anyway" and carries `option` as its field
// (core/base/status_field.h). Other statuses are returned unchanged.
absl::Status WithVerifyChecksumsOption(const absl::Status& status, absl::string_view option);

}  // namespace lgpt

#endif  // LGPT_CORE_IO_TORCH_PICKLE_H_
