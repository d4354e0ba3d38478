#include "usrc/common/config_text.h"

#include <charconv>

namespace usrc::config {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string each_line(std::string_view text, const std::function<std::string(const Line &)> &each) {
  Line line;
  while (!text.empty()) {
    line.number++;
    size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    // The comment: from a '#' that starts a word.
    for (size_t i = 0; i < raw.size(); i++)
      if (raw[i] == '#' && (i == 0 || blank(raw[i - 1]))) {
        raw = raw.substr(0, i);
        break;
      }
    line.text = trim(raw);
    if (line.text.empty()) continue;
    line.words.clear();
    for (std::string_view rest = line.text; !rest.empty(); rest = trim(rest)) {
      size_t end = 0;
      while (end < rest.size() && !blank(rest[end])) end++;
      line.words.push_back(rest.substr(0, end));
      rest.remove_prefix(end);
    }
    if (std::string why = each(line); !why.empty())
      return "line " + std::to_string(line.number) + ": " + why;
  }
  return "";
}

bool key_value(const Line &line, std::string_view *key, std::string_view *value) {
  size_t eq = line.text.find('=');
  if (eq == std::string_view::npos) return false;
  *key = trim(line.text.substr(0, eq));
  *value = trim(line.text.substr(eq + 1));
  if (key->empty()) return false;
  for (char c : *key)
    if (blank(c)) return false;
  return true;
}

std::optional<uint64_t> to_uint(std::string_view s, uint64_t max, bool hex) {
  int base = 10;
  if (hex && s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v > max) return std::nullopt;
  return v;
}

}  // namespace usrc::config
