#include <CLI/CLI.hpp>

#include "cli.h"

using namespace usrc::cli;

int main(int argc, char **argv) {
  CLI::App app{"usrc: user-space RDMA (InfiniBand RC over UDP) devices"};
  app.set_version_flag("--version", "usrc 0.1.0");
  app.require_subcommand(1);

  auto *link = app.add_subcommand("link", "manage usrc devices");
  link->require_subcommand(1);

  LinkAddArgs add;
  std::vector<std::string> words;
  auto *ladd = link->add_subcommand("add", "create a device: add NAME netdev IF [type ib|roce] [port P] [backend udp|xdp|ofi] [provider P]");
  ladd->add_option("name", add.name, "device name")->required();
  ladd->add_option("words", words, "netdev IF [type ib|roce] [port P] [backend udp|xdp|ofi] [provider P]")->required();

  std::string del_name;
  auto *ldel = link->add_subcommand("del", "remove a device");
  ldel->add_option("name", del_name, "device name")->required();

  std::string show_name;
  bool json = false;
  auto *lshow = link->add_subcommand("show", "list devices");
  lshow->add_option("name", show_name, "device name");
  lshow->add_flag("--json,-j", json, "JSON output");

  std::string stats_name;
  bool stats_json = false;
  auto *stats = app.add_subcommand("stats", "show the protocol counters of devices");
  stats->add_option("name", stats_name, "device name (or: reset NAME)");
  std::string reset_name;
  stats->add_option("reset_name", reset_name, "with 'reset': the device to zero");
  stats->add_flag("--json,-j", stats_json, "JSON output");

  app.add_subcommand("exec", "run a program with usrc devices visible: exec -- CMD [ARGS]");
  // Everything after `exec [--]` belongs to the command, options included.
  if (argc >= 2 && std::string(argv[1]) == "exec") {
    int first = (argc >= 3 && std::string(argv[2]) == "--") ? 3 : 2;
    return exec_cmd(std::vector<std::string>(argv + first, argv + argc));
  }

  app.add_subcommand("trace",
                     "run a program through usrc exec, capturing its packets: trace FILE -- CMD "
                     "[ARGS] (%p in FILE: the pid of each process)");
  if (argc >= 2 && std::string(argv[1]) == "trace") {
    if (argc < 4) {
      fprintf(stderr, "usrc: usage: usrc trace FILE.pcap -- CMD [ARGS...]\n");
      return 2;
    }
    setenv("USRC_TRACE", argv[2], 1);
    int first = (argc >= 4 && std::string(argv[3]) == "--") ? 4 : 3;
    return exec_cmd(std::vector<std::string>(argv + first, argv + argc));
  }

  CLI11_PARSE(app, argc, argv);

  if (*ladd) {
    // `link add NAME netdev IF [type ib|roce] [port P] [backend udp|xdp|ofi] [provider P]`, iproute2 style.
    for (size_t i = 0; i < words.size(); i++) {
      const std::string &k = words[i];
      if (i + 1 >= words.size()) {
        fprintf(stderr, "usrc: '%s' needs a value\n", k.c_str());
        return 2;
      }
      const std::string &v = words[++i];
      if (k == "netdev") add.netdev = v;
      else if (k == "type") add.type = v;
      else if (k == "backend") add.backend = v;
      else if (k == "provider") add.provider = v;
      else if (k == "port") {
        try {
          add.port = std::stoi(v);
        } catch (...) {
          fprintf(stderr, "usrc: bad port '%s'\n", v.c_str());
          return 2;
        }
      } else {
        fprintf(stderr, "usrc: unknown keyword '%s' (expected netdev, type, port, backend, provider)\n", k.c_str());
        return 2;
      }
    }
    if (add.netdev.empty()) {
      fprintf(stderr, "usrc: link add needs 'netdev IFNAME'\n");
      return 2;
    }
    return link_add(add);
  }
  if (*ldel) return link_del(del_name);
  if (*lshow) return link_show(show_name, json);
  if (*stats) {
    if (stats_name == "reset") return stats_reset(reset_name);
    return stats_show(stats_name, stats_json);
  }
  return 2;
}
