// The flags of every tool that loads a checkpoint, defined once: --verify_checksums.
#ifndef LGPT_TOOLS_LOAD_FLAGS_H_
#define LGPT_TOOLS_LOAD_FLAGS_H_

#include "core/model/checkpoint.h"

namespace lgpt {

// --verify_checksums (default true): check lit_model.pth's records against their CRC-32s.
bool VerifyChecksumsFlag();

// The loading flags into `options` (verify_checksums).
void ApplyLoadFlags(LoadOptions& options);

}  // namespace lgpt

#endif  // LGPT_TOOLS_LOAD_FLAGS_H_
