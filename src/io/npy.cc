#include "io/npy.h"

#include <bit>
#include <cstring>

#include "core/mapped_file.h"

namespace vlm {

// Data is copied with memcpy from '<' (little-endian) files.
static_assert(std::endian::native == std::endian::little, "npy reader needs a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes, then major and minor version bytes
constexpr size_t kMagicLen = 6;

// Parser for the header numpy writes: a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only the three keys numpy uses, and only string, bool and int-tuple values.
class HeaderParser {
 public:
  HeaderParser(const char* p, size_t n) : p_(p), end_(p + n) {}

  // Fills the three fields; returns false with error() set on anything unexpected.
  bool parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return fail("header does not start with '{'");
    skip_ws();
    while (!peek('}')) {
      std::string key;
      if (!parse_str(&key)) return false;
      skip_ws();
      if (!eat(':')) return fail("expected ':' after key '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (!parse_str(descr)) return false;
        have_descr = true;
      } else if (key == "fortran_order") {
        if (!parse_bool(fortran_order)) return false;
        have_order = true;
      } else if (key == "shape") {
        if (!parse_tuple(shape)) return false;
        have_shape = true;
      } else {
        return fail("unexpected key '" + key + "'");
      }
      skip_ws();
      if (!eat(',')) break;  // numpy writes a trailing comma; the last one is optional
      skip_ws();
    }
    if (!eat('}')) return fail("expected ',' or '}' in header dict");
    skip_ws();
    if (p_ != end_) return fail("unexpected bytes after the header dict");
    if (!have_descr || !have_order || !have_shape) {
      return fail("header lacks 'descr', 'fortran_order' or 'shape'");
    }
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  bool fail(std::string msg) {
    error_ = std::move(msg);
    return false;
  }
  void skip_ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool peek(char c) const { return p_ != end_ && *p_ == c; }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++p_;
    return true;
  }
  bool eat_word(const char* w) {
    size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
    p_ += n;
    return true;
  }
  // A quoted string without escapes (numpy's keys and descr never need them).
  bool parse_str(std::string* out) {
    if (p_ == end_ || (*p_ != '\'' && *p_ != '"')) return fail("expected a quoted string");
    char q = *p_++;
    const char* start = p_;
    while (p_ != end_ && *p_ != q) {
      if (*p_ == '\\' || static_cast<unsigned char>(*p_) < 0x20) {
        return fail("unsupported character in header string");
      }
      ++p_;
    }
    if (p_ == end_) return fail("unterminated string in header");
    out->assign(start, p_);
    ++p_;
    return true;
  }
  bool parse_bool(bool* out) {
    if (eat_word("True")) {
      *out = true;
    } else if (eat_word("False")) {
      *out = false;
    } else {
      return fail("'fortran_order' is not True or False");
    }
    return true;
  }
  bool parse_int(int64_t* out) {
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return fail("shape entry is not a non-negative int");
    int64_t v = 0;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p_ - '0', &v)) {
        return fail("shape entry overflows int64");
      }
      ++p_;
    }
    eat('L');  // Python 2 numpy wrote longs as "3L"
    *out = v;
    return true;
  }
  bool parse_tuple(std::vector<int64_t>* out) {
    out->clear();
    if (!eat('(')) return fail("'shape' is not a tuple");
    skip_ws();
    while (!peek(')')) {
      int64_t d = 0;
      if (!parse_int(&d)) return false;
      out->push_back(d);
      skip_ws();
      if (!eat(',')) break;
      skip_ws();
    }
    if (!eat(')')) return fail("expected ',' or ')' in 'shape'");
    return true;
  }

  const char* p_;
  const char* end_;
  std::string error_;
};

}  // namespace

Result<NpyArray> read_npy(const std::string& path) {
  VLM_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(path));
  const uint8_t* b = mf.data();
  const size_t size = mf.size();

  if (size < kMagicLen + 2 || std::memcmp(b, kMagic, kMagicLen) != 0) {
    return data_loss(path + ": not a .npy file (missing \\x93NUMPY magic)");
  }
  const int major = b[6];
  size_t len_bytes = 0;
  if (major == 1) {
    len_bytes = 2;
  } else if (major == 2 || major == 3) {
    len_bytes = 4;
  } else {
    return data_loss(path + ": unsupported .npy format version " + std::to_string(major) + "." +
                     std::to_string(b[7]));
  }
  const size_t header_start = kMagicLen + 2 + len_bytes;
  if (size < header_start) return data_loss(path + ": truncated .npy header");
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) header_len |= uint64_t{b[8 + i]} << (8 * i);
  if (header_len > size - header_start) {
    return data_loss(path + ": header length " + std::to_string(header_len) +
                     " runs past the end of the " + std::to_string(size) + "-byte file");
  }

  NpyArray out;
  std::string descr;
  bool fortran_order = false;
  HeaderParser parser(reinterpret_cast<const char*>(b + header_start), header_len);
  if (!parser.parse(&descr, &fortran_order, &out.shape)) {
    return data_loss(path + ": bad .npy header: " + parser.error());
  }
  size_t item = 0;
  if (descr == "<f4") {
    out.dtype = DType::kF32;
    item = 4;
  } else if (descr == "<i4") {
    out.dtype = DType::kI64;
    item = 4;
  } else if (descr == "<i8") {
    out.dtype = DType::kI64;
    item = 8;
  } else if (descr == "|u1" || descr == "<u1") {
    out.dtype = DType::kU8;
    item = 1;
  } else {
    return invalid_argument(path + ": unsupported dtype '" + descr +
                            "' (supported: '<f4', '<i4', '<i8', '|u1')");
  }
  if (fortran_order) {
    return invalid_argument(path + ": Fortran-order arrays are not supported (save C order)");
  }

  uint64_t numel = 1, nbytes = item;
  for (int64_t d : out.shape) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        __builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes)) {
      return data_loss(path + ": shape " + shape_to_string(out.shape) + " overflows");
    }
  }
  const uint64_t data_size = size - header_start - header_len;
  if (data_size != nbytes) {
    return data_loss(path + ": data is " + std::to_string(data_size) + " bytes but " + descr + " " +
                     shape_to_string(out.shape) + " needs " + std::to_string(nbytes));
  }

  const uint8_t* src = b + header_start + header_len;  // [numel * item] bytes
  if (descr == "<f4") {
    out.f32.resize(numel);
    if (numel > 0) std::memcpy(out.f32.data(), src, nbytes);
  } else if (descr == "<i8") {
    out.i64.resize(numel);
    if (numel > 0) std::memcpy(out.i64.data(), src, nbytes);
  } else if (out.dtype == DType::kU8) {
    out.u8.assign(src, src + numel);
  } else {
    out.i64.resize(numel);
    for (uint64_t i = 0; i < numel; ++i) {
      int32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out.i64[i] = v;
    }
  }
  return out;
}

}  // namespace vlm
