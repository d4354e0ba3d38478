// tshark -T fields -E header=y -E separator=, output, read back by field name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <istream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace usrc::test {

// One packet: field name -> text ("" when the packet lacks the field).
using TsharkRow = std::map<std::string, std::string>;

inline std::vector<std::string> split_csv(const std::string &line) {
  std::vector<std::string> cols;
  std::string c;
  std::stringstream ss(line);
  while (std::getline(ss, c, ',')) cols.push_back(c);
  if (!line.empty() && line.back() == ',') cols.push_back("");
  return cols;
}

inline std::vector<TsharkRow> read_tshark_rows(std::istream &in) {
  std::vector<TsharkRow> rows;
  std::string line;
  if (!std::getline(in, line)) return rows;
  const auto names = split_csv(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto cols = split_csv(line);
    cols.resize(names.size());
    TsharkRow r;
    for (size_t i = 0; i < names.size(); i++) r[names[i]] = cols[i];
    rows.push_back(std::move(r));
  }
  return rows;
}

// Runs a command and returns its standard output; `ok` = exit status 0.
inline std::string run_capture(const std::string &cmd, bool &ok) {
  std::string out;
  FILE *p = popen(cmd.c_str(), "r");
  ok = p != nullptr;
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ok = pclose(p) == 0;
  return out;
}

// tshark's number formats: decimal or 0x-hex; an empty field is -1.
inline uint64_t tshark_num(const std::string &s) {
  return s.empty() ? ~uint64_t(0) : std::stoull(s, nullptr, 0);
}
// Wireshark 4.0 prints booleans as 0/1, later versions as True/False.
inline bool tshark_flag(const std::string &s) { return s == "1" || s == "True" || s == "true"; }
// FT_BYTES: "1234abc1" (4.0) or "12:34:ab:c1"; read as a big-endian number.
inline uint64_t tshark_bytes(std::string s) {
  std::erase(s, ':');
  return s.empty() ? ~uint64_t(0) : std::stoull(s, nullptr, 16);
}

}  // namespace usrc::test
