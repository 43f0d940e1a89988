#include "server/base64.h"

#include <gtest/gtest.h>

#include <string>

namespace vlm {
namespace {

std::string decode_str(std::string_view in) {
  auto r = base64_decode(in);
  EXPECT_TRUE(r.ok()) << in << ": " << r.status().message();
  if (!r.ok()) return "<error>";
  return std::string(r->begin(), r->end());
}

// RFC 4648 §10 test vectors.
TEST(Base64Test, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, enc] : vectors) {
    EXPECT_EQ(base64_encode(std::string_view(plain)), enc);
    EXPECT_EQ(decode_str(enc), plain);
    EXPECT_EQ(base64_decoded_size(enc), std::string_view(plain).size());
  }
}

TEST(Base64Test, AllByteValuesRoundTrip) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t len : {0, 1, 2, 3, 100, 255, 256}) {
    const std::string s = all.substr(0, len);
    EXPECT_EQ(decode_str(base64_encode(s)), s) << len;
  }
  EXPECT_EQ(decode_str("+/+/"), "\xfb\xff\xbf");
}

TEST(Base64Test, RejectsMalformedInput) {
  for (const char* bad : {
           "Zg",         // missing padding
           "Zg=",        // length not a multiple of 4
           "Zm9v\n",     // whitespace is rejected
           "Zm 9v",      // ... anywhere
           "Zm9v YmFy",  // ...
           "Z===",       // too much padding
           "=Zm9",       // padding first
           "Zg==Zm9v",   // padding before the end
           "Zm=v",       // data after padding
           "Zh==",       // non-zero padding bits (canonical is Zg==)
           "Zm9=",       // non-zero padding bits (canonical is Zm8=)
           "Zm9v-_==",   // URL-safe alphabet is not the standard one
           "Zm9*",       // invalid character
       }) {
    EXPECT_FALSE(base64_decode(bad).ok()) << "accepted: " << bad;
  }
  const std::string with_nul("Zm9\0", 4);
  EXPECT_FALSE(base64_decode(with_nul).ok());
}

}  // namespace
}  // namespace vlm
