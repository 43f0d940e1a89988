// Option help shared by the CLI's subcommands.
#pragma once

namespace vlm::cli {

inline constexpr const char* kQuantHelp =
    "Quantize the text decoder's linear weights at load: int8 (one scale per output row) or "
    "int4 (one scale per 32 inputs)";

inline constexpr const char* kMmapHelp =
    "Serve the weights straight from the checkpoint's file mapping (faster start-up, page cache "
    "shared between processes) instead of copying them onto 2 MiB pages (~10% faster prefill "
    "and decode)";

inline constexpr const char* kVisionFp16Help =
    "Run the vision encoder's matmuls in FP16 arithmetic on CPUs with AVX-512 FP16 (twice the "
    "multiply rate; activations and runs of 32 products rounded to FP16); ignored elsewhere";

}  // namespace vlm::cli
