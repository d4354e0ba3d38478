#include <CLI/CLI.hpp>
#include <cstdlib>

#include "cli.h"
#include "usrc/version.h"

using namespace usrc::cli;

int main(int argc, char **argv) {
  CLI::App app{"usrc: user-space RDMA (InfiniBand RC over UDP) devices"};
  app.set_version_flag("--version", "usrc " USRC_VERSION);
  app.require_subcommand(1);

  auto *link = app.add_subcommand("link", "manage usrc devices");
  link->require_subcommand(1);

  LinkAddArgs add;
  std::vector<std::string> words;
  auto *ladd = link->add_subcommand("add", "create a device: add NAME netdev IF [type ib|roce] [port P] [backend udp|xdp|ofi] [provider P] [sa ADDR[:PORT]]");
  ladd->add_option("name", add.name, "device name")->required();
  ladd->add_option("words", words, "netdev IF [type ib|roce] [port P] [backend udp|xdp|ofi] [provider P] [sa ADDR[:PORT]]")->required();

  std::string del_name;
  auto *ldel = link->add_subcommand("del", "remove a device");
  ldel->add_option("name", del_name, "device name")->required();

  std::string config = kLinksConf;
  auto *lrestore = link->add_subcommand("restore", "add the devices listed in a config file (idempotent)");
  lrestore->add_option("--config,-c", config, "config file")->capture_default_str();
  auto *lflush = link->add_subcommand("flush", "remove the devices listed in a config file");
  lflush->add_option("--config,-c", config, "config file")->capture_default_str();

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

  SaArgs sa;
  auto *sacmd = app.add_subcommand("sa", "the subnet administrator: sa --listen ADDR[:PORT] runs it (docs/sa.md)");
  sacmd->add_option("--listen,-l", sa.listen, "serve on ADDR[:PORT] (port 4791 unless given)");
  sacmd->add_option("--state", sa.state, "keep the registrations in this file (LIDs survive a restart)");
  auto *saq = sacmd->add_subcommand("query", "print SA records: query [path|node|port]");
  saq->add_option("kind", sa.kind, "path, node or port")->check(CLI::IsMember({"path", "node", "port"}));
  saq->add_option("--sa", sa.sa, "the SA's ADDR[:PORT] (else the device's)");
  saq->add_option("--device,-d", sa.device, "the device whose SA to ask");
  saq->add_option("--slid", sa.slid, "path: source LID");
  saq->add_option("--dlid", sa.dlid, "path: destination LID");
  saq->add_option("--sgid", sa.sgid, "path: source GID");
  saq->add_option("--dgid", sa.dgid, "path: destination GID");
  saq->add_option("--lid", sa.lid, "node, port: the port's LID");
  saq->add_option("--guid", sa.guid, "node: the port GUID (0x hex or decimal)");
  saq->add_option("--window", sa.window, "RMPP window: segments per ACK")->check(CLI::Range(1, 1024));
  saq->add_flag("--get", sa.get, "SubnAdmGet (one record) instead of SubnAdmGetTable");
  saq->add_flag("--json,-j", sa.json, "JSON output");
  auto *sar = sacmd->add_subcommand("register", "register a port by hand: register --sa ADDR --guid G --addr IP");
  sar->add_option("--sa", sa.sa, "the SA's ADDR[:PORT]")->required();
  sar->add_option("--guid", sa.guid, "port GUID (0x hex or decimal)")->required();
  sar->add_option("--addr", sa.addr, "the port's IPv4 address")->required();
  sar->add_option("--port", sa.port, "its UDP base port")->check(CLI::Range(1, 65535));
  sar->add_option("--desc", sa.desc, "its description");

  app.add_subcommand("exec", "run a program with usrc devices visible: exec [--trace FILE] -- CMD [ARGS]");
  // Everything after `exec [--]` belongs to the command, options included.
  if (argc >= 2 && std::string(argv[1]) == "exec") {
    int first = 2;
    // --trace FILE: the provider writes the program's packets to FILE
    // (pcap; "%p" becomes the process id), through USRC_TRACE.
    if (argc >= 4 && std::string(argv[2]) == "--trace") {
      setenv("USRC_TRACE", argv[3], 1);
      first = 4;
    }
    if (argc > first && std::string(argv[first]) == "--") first++;
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

  // A usage error exits with 2 (usrc(8)), whichever part of the command
  // line CLI11 found wrong; --help and --version exit with 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*ladd) {
    if (std::string bad = link_words({words.begin(), words.end()}, add); !bad.empty()) {
      fprintf(stderr, "usrc: %s\n", bad.c_str());
      return 2;
    }
    return link_add(add);
  }
  if (*ldel) return link_del(del_name);
  if (*lrestore) return link_restore(config);
  if (*lflush) return link_flush(config);
  if (*lshow) return link_show(show_name, json);
  if (*saq) return sa_query(sa);
  if (*sar) return sa_register(sa);
  if (*sacmd) {
    // (usrc-sa.service: the address from /etc/usrc/sa.conf, in the environment.)
    if (const char *e = getenv("USRC_SA_LISTEN"); sa.listen.empty() && e) sa.listen = e;
    if (sa.listen.empty()) {
      fprintf(stderr, "usrc: sa: --listen ADDR[:PORT] (or USRC_SA_LISTEN), or a subcommand (query, register)\n");
      return 2;
    }
    return sa_serve(sa);
  }
  if (*stats) {
    if (stats_name == "reset") return stats_reset(reset_name);
    return stats_show(stats_name, stats_json);
  }
  return 2;
}
