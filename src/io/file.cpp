#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw Error(path.string() + ": no such file");
  if (fs::is_directory(status)) throw Error(path.string() + ": is a folder, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open for reading: " + std::strerror(errno));
  std::string bytes;
  const auto size = fs::file_size(path, ec);
  if (!ec) bytes.reserve(static_cast<size_t>(size));
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(path.string() + ": read failed: " + std::strerror(errno));
  return bytes;
}

namespace {

[[noreturn]] void throw_errno(const fs::path& path, const std::string& action, int err) {
  throw Error(path.string() + ": " + action + " failed: " + std::strerror(err));
}

std::string temporary_name(const fs::path& path) {
  std::random_device rd;
  return path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
         std::to_string(rd() & 0xffffff);
}

}  // namespace

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    throw Error(path.string() + ": cannot write: folder '" + folder.string() + "' does not exist");
  }
  const fs::path tmp = folder / temporary_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(path, "creating a temporary file in '" + folder.string() + "'", errno);
  auto fail = [&](const std::string& action) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw_errno(path, action, err);
  };
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing " + std::to_string(bytes.size()) + " bytes");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_errno(path, "close", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_errno(path, "renaming the temporary file over it", err);
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace onnxtrain::io
