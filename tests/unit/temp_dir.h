// A directory under /tmp for one test, removed with what it holds when the
// test ends, passed or failed.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <system_error>

struct TempDir {
  std::string path;
  explicit TempDir(const std::string &name) {
    std::string t = "/tmp/" + name + ".XXXXXX";
    REQUIRE(mkdtemp(t.data()));
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
};
