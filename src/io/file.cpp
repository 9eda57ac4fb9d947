#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

void read_file(const fs::path& path, const std::function<void(int fd)>& read) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw Error(path.string() + ": no such file");
  if (fs::is_directory(status)) throw Error(path.string() + ": is a folder, expected a file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot open for reading: " + std::strerror(errno));
  try {
    read(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string read_file(const fs::path& path) {
  std::string bytes;
  read_file(path, [&](int fd) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!ec) bytes.reserve(static_cast<size_t>(size));
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(path.string() + ": read failed: " + std::strerror(errno));
      }
      bytes.append(buffer, static_cast<size_t>(n));
    }
  });
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
  write_file_atomic(path, [&](int fd) {
    const char* p = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return "writing " + std::to_string(bytes.size()) + " bytes";
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return std::string();
  });
}

void write_file_atomic(const fs::path& path, const std::function<std::string(int fd)>& write) {
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
  std::string failed;
  try {
    failed = write(fd);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (!failed.empty()) fail(failed);
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
