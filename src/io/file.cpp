#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
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

const char kTemporaryInfix[] = ".tmp-";

// "<filename>.tmp-<pid>-<random>": the name a temporary file of `path` has while it is linked.
std::string temporary_name(const fs::path& path) {
  std::random_device rd;
  return path.filename().string() + kTemporaryInfix + std::to_string(::getpid()) + "-" +
         std::to_string(rd() & 0xffffff);
}

// The writer's process id when `name` is "<filename>.tmp-<pid>-<digits>", else 0.
pid_t temporary_owner(const std::string& name, const std::string& filename) {
  const std::string prefix = filename + kTemporaryInfix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
  const char* p = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  int64_t pid = 0;
  const auto [after_pid, ec] = std::from_chars(p, end, pid);
  if (ec != std::errc() || after_pid == end || *after_pid != '-') return 0;
  const char* digits = after_pid + 1;
  if (digits == end || !std::all_of(digits, end, [](char c) { return c >= '0' && c <= '9'; })) return 0;
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) return 0;
  return static_cast<pid_t>(pid);
}

// Removes the temporary files of `path` whose writer no longer exists (kill(pid, 0) fails with
// ESRCH): what a writer killed between linking and renaming leaves. Files of live processes
// (another writer at work, or a reused pid: kept until a later write), of other targets, and
// errors (a folder that cannot be listed, a file already gone) are left alone.
void remove_stale_temporaries(const fs::path& folder, const fs::path& path) {
  const std::string filename = path.filename().string();
  std::error_code ec;
  fs::directory_iterator it(folder, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const pid_t pid = temporary_owner(it->path().filename().string(), filename);
    if (pid != 0 && ::kill(pid, 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

// An open file to write `path`'s new contents into, and how to put it in place.
struct Temporary {
  int fd = -1;
  fs::path named;  // its name in the folder; empty while it has none (O_TMPFILE)
};

// An unnamed file in `folder` (O_TMPFILE, Linux 3.11; open(2)): a writer killed before it is
// linked leaves nothing. Falls back to a named one where the filesystem or kernel lacks
// O_TMPFILE (EOPNOTSUPP, EISDIR, EINVAL) or no /proc/self/fd can link it.
Temporary open_temporary(const fs::path& folder, const fs::path& path) {
  Temporary t;
#ifdef O_TMPFILE
  if (::access("/proc/self/fd", X_OK) == 0) {
    t.fd = ::open(folder.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (t.fd >= 0) return t;
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
      const int err = errno;
      throw_errno(path, "creating a temporary file in '" + folder.string() + "'", err);
    }
  }
#endif
  t.named = folder / temporary_name(path);
  t.fd = ::open(t.named.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (t.fd < 0) {
    const int err = errno;
    throw_errno(path, "creating a temporary file in '" + folder.string() + "'", err);
  }
  return t;
}

// Gives an unnamed temporary file a name: linkat with AT_EMPTY_PATH (where the kernel permits
// it: CAP_DAC_READ_SEARCH), else through /proc/self/fd (open(2), O_TMPFILE); another random
// name when one is taken. Returns false with errno set when it cannot.
bool link_temporary(Temporary& t, const fs::path& folder, const fs::path& path) {
  const std::string proc = "/proc/self/fd/" + std::to_string(t.fd);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const fs::path name = folder / temporary_name(path);
#ifdef AT_EMPTY_PATH
    bool linked = ::linkat(t.fd, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH) == 0;
#else
    bool linked = false;
#endif
    if (!linked) linked = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0;
    if (linked) {
      t.named = name;
      return true;
    }
    if (errno != EEXIST) return false;
  }
  return false;
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
  remove_stale_temporaries(folder, path);
  Temporary t = open_temporary(folder, path);
  // Closes and removes the temporary file (an unnamed one vanishes when closed).
  auto discard = [&] {
    if (t.fd >= 0) ::close(t.fd);
    if (!t.named.empty()) ::unlink(t.named.c_str());
  };
  // Reads errno before anything else can change it.
  auto fail = [&](const char* action) {
    const int err = errno;
    discard();
    throw_errno(path, action, err);
  };
  std::string failed;
  try {
    failed = write(t.fd);
  } catch (...) {
    discard();
    throw;
  }
  if (!failed.empty()) fail(failed.c_str());
  if (::fsync(t.fd) != 0) fail("fsync");
  if (t.named.empty() && !link_temporary(t, folder, path)) fail("linking the temporary file into its folder");
  const int fd = t.fd;
  t.fd = -1;
  if (::close(fd) != 0) fail("close");
  if (::rename(t.named.c_str(), path.c_str()) != 0) fail("renaming the temporary file over it");
  // Make the rename itself durable.
  const int dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace onnxtrain::io
