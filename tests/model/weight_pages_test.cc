// Weights on 2 MiB pages (the default; EngineOptions::mmap_weights = false): the buffer itself,
// the copy of every matmul weight out of the file mapping, and bit-identical logits either way;
// the KV cache's lazy reservation resident by small pages where written.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/huge_page_buffer.h"
#include "model/fixture_model.h"
#include "model/qwen3vl_weights.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;

// A lazy reservation (the KV cache's) is resident by 4 KiB page as written, never by 2 MiB: a
// byte written in each of three 2 MiB spans makes three small pages resident (mincore), not 1536.
TEST(HugePageBuffer, NoreserveIsResidentOnlyWhereWrittenBySmallPages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (modes.empty() || modes.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "no transparent huge pages here: every mapping is resident by small pages";
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto b = HugePageBuffer::allocate(16 * HugePageBuffer::kHugePage, /*noreserve=*/true);
  ASSERT_TRUE(b.ok()) << b.status().message();
  for (size_t span : {0, 5, 15}) b->data()[span * HugePageBuffer::kHugePage + 100] = 1;
  std::vector<unsigned char> in_core(b->size() / page);
  ASSERT_EQ(::mincore(b->data(), b->size(), in_core.data()), 0);
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  EXPECT_GE(resident, 3u);
  EXPECT_LE(resident, 3 * (size_t{64} << 10) / page) << "pages resident of " << in_core.size();
}

TEST(HugePageBuffer, AlignedWholeHugePagesAndWritable) {
  for (size_t bytes : {size_t{1}, HugePageBuffer::kHugePage, HugePageBuffer::kHugePage + 1}) {
    auto b = HugePageBuffer::allocate(bytes);
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_GE(b->size(), bytes);
    EXPECT_EQ(b->size() % HugePageBuffer::kHugePage, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % HugePageBuffer::kHugePage, 0u);
    for (size_t i = 0; i < b->size(); i += 4096) b->data()[i] = static_cast<uint8_t>(i >> 12);
    for (size_t i = 0; i < b->size(); i += 4096) {
      ASSERT_EQ(b->data()[i], static_cast<uint8_t>(i >> 12));
    }
    HugePageBuffer moved = std::move(b).value();
    EXPECT_GE(moved.size(), bytes);
  }
  // Sizes no address space holds (and one whose rounding up would wrap) are refused by size.
  for (size_t bytes : {size_t{1} << 60, std::numeric_limits<size_t>::max()}) {
    auto huge = HugePageBuffer::allocate(bytes);
    ASSERT_FALSE(huge.ok()) << bytes;
    EXPECT_EQ(huge.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(huge.status().message().find(std::to_string(bytes)), std::string::npos)
        << huge.status().message();
  }
  auto empty = HugePageBuffer::allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0u);
}

// Every matmul weight view of the text decoder (a Gated DeltaNet's, a mixture of experts' each
// expert, shared expert, router and gate too) and of the vision tower.
std::vector<const TensorView*> matmul_views(const TextWeights& t, const VisionWeights* v) {
  std::vector<const TensorView*> out = {&t.lm_head};
  const auto add = [&](const TensorView& w) {
    if (w.data != nullptr) out.push_back(&w);
  };
  for (const TextLayerWeights& L : t.layers) {
    const DeltaNetWeights& d = L.delta;
    const MoeWeights& m = L.moe;
    for (const TensorView* w :
         {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj,
          &d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj, &m.router,
          &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_expert_gate}) {
      add(*w);
    }
    for (size_t e = 0; e < m.gate.size(); ++e) {
      for (const TensorView* w : {&m.gate[e], &m.up[e], &m.down[e]}) add(*w);
    }
  }
  if (v != nullptr) {
    out.push_back(&v->patch_embed);
    for (const VisionBlockWeights& B : v->blocks) {
      for (const TensorView* w : {&B.qkv, &B.proj, &B.fc1, &B.fc2}) out.push_back(w);
    }
    for (const VisionMergerWeights* M : {&v->merger}) {
      out.push_back(&M->fc1);
      out.push_back(&M->fc2);
    }
    for (const VisionMergerWeights& M : v->deepstack_mergers) {
      out.push_back(&M.fc1);
      out.push_back(&M.fc2);
    }
  }
  return out;
}

TEST(CopyWeightsToHugePages, MovesEveryMatmulWeightOutOfTheFileWithTheSameBytes) {
  // qwen35moe-f32-a: Qwen3.5 MoE's experts, views of the rows of its fused tensors.
  for (const char* name :
       {"text-f32-untied", "text-f32-hd128-tied", "vision-f32", "qwen35moe-f32-a"}) {
    auto m = test_util::load_fixture_model(kFixtures + "/" + name);
    ASSERT_TRUE(m.ok()) << m.status().message();
    TextWeights* text = &m->text;
    const WeightStore* store = m->store.get();
    const bool vision = std::string(name) == "vision-f32";
    Result<VisionWeights> vw = VisionWeights{};
    if (vision) vw = load_vision_weights(*store, m->cfg);
    ASSERT_TRUE(vw.ok()) << vw.status().message();
    const bool tied = text->lm_head.data == text->embed_tokens.data;
    if (std::string(name) == "text-f32-untied") EXPECT_FALSE(tied);
    if (std::string(name) == "text-f32-hd128-tied") EXPECT_TRUE(tied);
    // The views as loaded, for their bytes (the file's pages are released, not unmapped: these
    // stay readable).
    const TextWeights before_text = *text;
    const VisionWeights before_vision = *vw;
    const auto before = matmul_views(before_text, vision ? &before_vision : nullptr);
    for (const TensorView* v : before) ASSERT_TRUE(store->holds(v->data, v->nbytes()));
    if (std::string(name) == "qwen35moe-f32-a") {  // 4 layers of 8 experts: gate, up, down each
      EXPECT_GE(before.size(), 4u * 8u * 3u);
    }

    auto buf = copy_weights_to_huge_pages(&*text, vision ? &*vw : nullptr, *store);
    ASSERT_TRUE(buf.ok()) << buf.status().message();
    const auto after = matmul_views(*text, vision ? &*vw : nullptr);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_FALSE(store->holds(after[i]->data, after[i]->nbytes())) << name << " view " << i;
      const auto* p = static_cast<const uint8_t*>(after[i]->data);
      EXPECT_TRUE(p >= buf->data() && p + after[i]->nbytes() <= buf->data() + buf->size());
      EXPECT_EQ(after[i]->shape, before[i]->shape);
      EXPECT_EQ(after[i]->dtype, before[i]->dtype);
      EXPECT_EQ(std::memcmp(after[i]->data, before[i]->data, before[i]->nbytes()), 0)
          << name << " view " << i;
    }
    // A tied lm_head still shares its bytes with the embedding; an untied embedding (row
    // lookups only) stays in the file mapping.
    if (tied) {
      EXPECT_EQ(text->embed_tokens.data, text->lm_head.data);
    } else {
      EXPECT_EQ(text->embed_tokens.data, before_text.embed_tokens.data);
    }
  }
}

TEST(CopyWeightsToHugePages, QuantizedWeightsStayInTheirOwnBuffers) {
  auto m = test_util::load_fixture_model(kFixtures + "/text-f32-hd128-tied");
  ASSERT_TRUE(m.ok()) << m.status().message();
  TextWeights* text = &m->text;
  const WeightStore* store = m->store.get();
  ThreadPool pool(1);
  ASSERT_TRUE(quantize_text_weights(&*text, WeightQuant::kInt8, pool, &*store).ok());
  const TextWeights quantized = *text;
  auto buf = copy_weights_to_huge_pages(&*text, nullptr, *store);
  ASSERT_TRUE(buf.ok());
  const auto now = matmul_views(*text, nullptr), was = matmul_views(quantized, nullptr);
  for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i]->data, was[i]->data) << i;
  // Nothing else needed copying: the tied embedding serves lookups from the file.
  EXPECT_EQ(text->embed_tokens.data, quantized.embed_tokens.data);
  EXPECT_EQ(buf->size(), 0u);
}

std::vector<float> engine_logits(const std::string& dir, bool mmap, const std::string& quant,
                                 const std::vector<int32_t>& ids,
                                 const std::vector<ImageInput>& images) {
  EngineOptions o;
  o.model_dir = dir;
  o.n_threads = 2;
  o.require_tokenizer = false;
  o.quant = parse_quant(quant.empty() ? "none" : quant).value();
  o.mmap_weights = mmap;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (!e.ok()) return {};
  auto l = (*e)->logits(ids, images, nullptr);
  EXPECT_TRUE(l.ok()) << l.status().message();
  return l.ok() ? *l : std::vector<float>{};
}

TEST(CopyWeightsToHugePages, EngineLogitsEqualTheFileMappedOnes) {
  const std::vector<int32_t> text_ids = {3, 17, 250, 9, 42, 101, 7};
  ImageInput cat;
  cat.path = kFixtures + "/vision-f32/synthetic_tiny.png";
  struct Case {
    std::string fixture, quant;
    std::vector<int32_t> ids;
    std::vector<ImageInput> images;
  };
  const std::vector<Case> cases = {
      {"text-f32-untied", "", text_ids, {}},
      {"text-f32-hd128-tied", "", text_ids, {}},
      {"text-f32-hd128-tied", "int8", text_ids, {}},
      {"vision-f32", "", {10, 13, 12, 1002, 1000, 1003, 899, 11}, {cat}},
  };
  for (const Case& c : cases) {
    const std::string dir = kFixtures + "/" + c.fixture;
    const auto mapped = engine_logits(dir, true, c.quant, c.ids, c.images);
    const auto paged = engine_logits(dir, false, c.quant, c.ids, c.images);
    ASSERT_FALSE(mapped.empty()) << c.fixture;
    ASSERT_EQ(mapped.size(), paged.size());
    for (size_t i = 0; i < mapped.size(); ++i) {
      ASSERT_EQ(mapped[i], paged[i]) << c.fixture << " " << c.quant << " " << i;
    }
  }
}

}  // namespace
}  // namespace vlm
