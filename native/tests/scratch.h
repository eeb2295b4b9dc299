// scratch.h — a temporary directory per test case and small file helpers for the native tests
// (what this process holds of a file: a forked child's inheritance).
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fastckpt_test {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class Scratch {
 public:
  Scratch() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fastckpt-native-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    dir_ = buf.data();
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// n bytes of a fixed pseudo-random pattern (seeded), so that a misplaced span shows.
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return out;
}

// Whether this process has a descriptor open on a file whose path starts with `path`.
inline bool holds_open(const std::string& path) {
  bool found = false;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      char link[4096];
      const std::string fd = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = ::readlink(fd.c_str(), link, sizeof link - 1);
      if (n > 0 && std::string(link, n).rfind(path, 0) == 0) found = true;
    }
    ::closedir(d);
  }
  return found;
}

// Whether this process maps a file whose path contains `path`.
inline bool holds_mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(path) != std::string::npos) return true;
  return false;
}

}  // namespace fastckpt_test
