#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

namespace vlm {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Closes the descriptor on every return path; the mapping outlives it (POSIX keeps the file
// referenced by the mapping itself).
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = "cannot open '" + path + "': " + errno_text(err);
    if (err == ENOENT || err == ENOTDIR) return not_found(std::move(msg));
    return invalid_argument(std::move(msg));
  }
  FdCloser closer(fd);

  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return internal_error("cannot stat '" + path + "': " + errno_text(errno));
  }
  // Directories open fine with O_RDONLY but cannot be mapped; pipes and devices have no fixed size.
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("'" + path + "' is not a regular file");
  }

  MappedFile mf;
  mf.path_ = path;
  if (st.st_size == 0) return mf;

  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    return internal_error("cannot mmap '" + path + "' (" + std::to_string(size) +
                          " bytes): " + errno_text(errno));
  }
  mf.data_ = static_cast<const uint8_t*>(p);
  mf.size_ = size;
  return mf;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

bool MappedFile::release_pages(const void* p, size_t n) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (data_ == nullptr || b < data_ || n > size_ ||
      b - data_ > static_cast<std::ptrdiff_t>(size_ - n)) {
    return false;
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(b) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(b) + n) / page * page;
  // The mapping is read-only and never written, so dropping pages loses nothing.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  return true;
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace vlm
