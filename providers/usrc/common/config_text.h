// The one reader of usrc's two small config formats: a device's usrc.conf
// (`key=value` lines, written by `usrc link add`, read by the provider) and
// /etc/usrc/links.conf (`NAME key value ...` lines, written by hand). Both
// have one entry a line; '#' at the start of a word comments out the rest of
// the line; blank lines are skipped. A bad line is reported by its number and
// nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace usrc::config {

struct Line {
  unsigned number = 0;                  // from 1
  std::string_view text;                // without its comment and outer blanks
  std::vector<std::string_view> words;  // text split at blanks
};

// Calls each(line) for every line that is not blank once its comment is
// gone, in order. each returns "" for a good line, else what is wrong with
// it; the first such message stops the walk and comes back as
// "line N: message". "" when every line was good.
std::string each_line(std::string_view text, const std::function<std::string(const Line &)> &each);

// A `key=value` line: the key (not empty, no blanks) and the value, both
// without outer blanks. False when the line is not of that form.
bool key_value(const Line &line, std::string_view *key, std::string_view *value);

// An unsigned number that is all of s and at most max: decimal, or
// hexadecimal after "0x" when hex is true. nullopt otherwise.
std::optional<uint64_t> to_uint(std::string_view s, uint64_t max, bool hex = false);

}  // namespace usrc::config
