// A fixture checkpoint loaded for the model tests that drive the weights or the decoder directly:
// its config, weight store and text-decoder weights.
#pragma once

#include <memory>
#include <string>

#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "vlm/status.h"

namespace vlm::test_util {

struct FixtureModel {
  Qwen3VLConfig cfg;
  std::unique_ptr<WeightStore> store;  // the views in `text` point into its mappings
  TextWeights text;
};

// dir: a checkpoint directory, e.g. VLM_FIXTURES_DIR + "/text-f32-untied".
inline Result<FixtureModel> load_fixture_model(const std::string& dir) {
  FixtureModel m;
  VLM_ASSIGN_OR_RETURN(m.cfg, load_qwen3vl_config(dir));
  VLM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(dir));
  m.store = std::make_unique<WeightStore>(std::move(store));
  VLM_ASSIGN_OR_RETURN(m.text, load_text_weights(*m.store, m.cfg));
  return m;
}

}  // namespace vlm::test_util
