// Writes usrc(7) from its template: the lines @TUNABLES@ and @COUNTERS@
// become the tables of the two X-macros (USRC_TUNABLES, USRC_COUNTERS), and
// @VERSION@ the project's version, so the page lists exactly what the code
// reads and counts. Usage: usrc_mangen TEMPLATE OUTPUT VERSION
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "usrc/common/tunables.h"
#include "usrc/device.h"

namespace {

// Text for a roff paragraph: backslashes escaped, no line starting with a
// control character.
std::string roff(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  return out;
}

std::string tunables() {
  std::ostringstream o;
#define USRC_X(type, name, env, def, doc)                                            \
  o << ".TP\n.B " << roff(env) << "\n" << roff(doc) << ". Default: " << (def) << ".\n";
  USRC_TUNABLES(USRC_X)
#undef USRC_X
  return o.str();
}

std::string counters() {
  std::ostringstream o;
#define USRC_X(name, doc) o << ".TP\n.B " << roff(#name) << "\n" << roff(doc) << ".\n";
  USRC_COUNTERS(USRC_X)
#undef USRC_X
  return o.str();
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 4) {
    std::cerr << "usage: usrc_mangen TEMPLATE OUTPUT VERSION\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "usrc_mangen: cannot read " << argv[1] << "\n";
    return 1;
  }
  std::ostringstream out;
  bool tun = false, cnt = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "@TUNABLES@") {
      out << tunables();
      tun = true;
      continue;
    }
    if (line == "@COUNTERS@") {
      out << counters();
      cnt = true;
      continue;
    }
    for (size_t p; (p = line.find("@VERSION@")) != std::string::npos;) line.replace(p, 9, argv[3]);
    out << line << "\n";
  }
  if (!tun || !cnt) {
    std::cerr << "usrc_mangen: " << argv[1] << " lacks the @TUNABLES@ or @COUNTERS@ line\n";
    return 1;
  }
  std::ofstream f(argv[2]);
  f << out.str();
  f.close();
  if (!f) {
    std::cerr << "usrc_mangen: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}
