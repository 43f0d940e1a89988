// Option help shared by the CLI's subcommands.
#pragma once

namespace vlm::cli {

inline constexpr const char* kQuantHelp =
    "Quantize the text decoder's linear weights at load: int8 (one scale per output row) or "
    "int4 (one scale per 32 inputs)";

}  // namespace vlm::cli
