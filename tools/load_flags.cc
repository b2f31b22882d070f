#include "tools/load_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(bool, verify_checksums, true,
          "check lit_model.pth (and pytorch_model.bin) records against their CRC-32s, so that a "
          "corrupt file fails to load naming the tensor; false skips the check (one read of the "
          "weights) for trusted storage");

namespace lgpt {

bool VerifyChecksumsFlag() { return absl::GetFlag(FLAGS_verify_checksums); }

void ApplyLoadFlags(LoadOptions& options) { options.verify_checksums = VerifyChecksumsFlag(); }

}  // namespace lgpt
