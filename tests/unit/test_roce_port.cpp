// The RoCE v2 port shared by the contexts of one address (net/roce_port.h):
// crafted datagrams to it reach the socket of the slot in their destination
// QPN, and still do after a member in the middle of the group leaves (the
// kernel moves the last socket into its hole, the registry follows).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "usrc/device.h"
#include "usrc/net/ipv4.h"
#include "usrc/net/roce_port.h"
#include "usrc/net/udp.h"

#include "temp_dir.h"

using namespace usrc;

namespace {

constexpr uint32_t kLo = 0x7f000001;

// A BTH (and an ICRC's room) for destination QPN slot << 12 | index.
std::vector<uint8_t> datagram(uint32_t slot, uint32_t index) {
  std::vector<uint8_t> d(16, 0);
  d[0] = 0x04;   // RC SEND_ONLY
  const uint32_t qpn = slot << kQpnIndexBits | index;
  d[5] = uint8_t(qpn >> 16), d[6] = uint8_t(qpn >> 8), d[7] = uint8_t(qpn);
  return d;
}

// Which of the sockets the datagram arrived at (-1: none within 2 s).
int arrival(const std::map<uint32_t, std::unique_ptr<net::RocePort>> &g, uint16_t port,
            const std::vector<uint8_t> &d, uint32_t *slot_out) {
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in to = net::to_sockaddr({kLo, port});
  REQUIRE(::sendto(s, d.data(), d.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof to) == ssize_t(d.size()));
  ::close(s);
  std::vector<pollfd> fds;
  std::vector<uint32_t> slots;
  for (auto &[slot, p] : g) fds.push_back({p->fd(), POLLIN, 0}), slots.push_back(slot);
  if (::poll(fds.data(), fds.size(), 2000) <= 0) return -1;
  for (size_t i = 0; i < fds.size(); i++)
    if (fds[i].revents & POLLIN) {
      uint8_t buf[64];
      REQUIRE(::recv(fds[i].fd, buf, sizeof buf, 0) == ssize_t(d.size()));
      *slot_out = slots[i];
      return int(i);
    }
  return -1;
}

}  // namespace

TEST_CASE("RoCE port: datagrams are steered by the slot in their QPN", "[nic][roce]") {
  TempDir dir("usrc-roce-port");
  std::mt19937 rng(std::random_device{}());
  const uint16_t port = uint16_t(40000 + rng() % 20000);   // (a free port: not 4791's group)
  std::map<uint32_t, std::unique_ptr<net::RocePort>> g;
  for (uint16_t slot : {5, 9, 12, 4000}) {
    std::string err;
    auto p = std::make_unique<net::RocePort>(kLo, port, slot, dir.path, 1 << 20, &err);
    INFO(err);
    REQUIRE(p->fd() >= 0);
    g[slot] = std::move(p);
  }
  auto check_all = [&] {
    for (auto &[slot, p] : g)
      for (uint32_t index : {0u, 1u, 4095u}) {
        uint32_t got = 0;
        INFO("slot " << slot << " index " << index);
        REQUIRE(arrival(g, port, datagram(slot, index), &got) >= 0);
        CHECK(got == slot);
      }
  };
  check_all();
  // A slot nobody has (QP1's 0 among them): some member gets it.
  for (uint32_t slot : {0u, 7u}) {
    uint32_t got = 0;
    CHECK(arrival(g, port, datagram(slot, 1), &got) >= 0);
  }
  // The first member leaves: the last takes its index, as the registry says.
  g.erase(5);
  check_all();
  // One in the middle, then a newcomer at the end.
  g.erase(9);
  std::string err;
  g[77] = std::make_unique<net::RocePort>(kLo, port, 77, dir.path, 1 << 20, &err);
  REQUIRE(g[77]->fd() >= 0);
  check_all();
}

TEST_CASE("RoCE port: a member that died without leaving is taken out when the next joins", "[nic][roce]") {
  TempDir dir("usrc-roce-port");
  std::mt19937 rng(std::random_device{}());
  const uint16_t port = uint16_t(40000 + rng() % 20000);
  // A child joins (index 0) and is killed; the parent's members then join.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::string err;
    net::RocePort p(kLo, port, 3, dir.path, 1 << 20, &err);
    ::pause();
    ::_exit(0);
  }
  for (int i = 0; i < 200 && !std::ifstream(dir.path + "/7f000001-" + std::to_string(port) + "/index").good(); i++)
    ::usleep(10000);
  ::usleep(50000);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  std::map<uint32_t, std::unique_ptr<net::RocePort>> g;
  for (uint16_t slot : {21, 22}) {
    std::string err;
    g[slot] = std::make_unique<net::RocePort>(kLo, port, slot, dir.path, 1 << 20, &err);
    REQUIRE(g[slot]->fd() >= 0);
  }
  for (auto &[slot, p] : g) {
    uint32_t got = 0;
    REQUIRE(arrival(g, port, datagram(slot, 3), &got) >= 0);
    CHECK(got == slot);
  }
}

// A context receives at two sockets: its own port and the RoCE port. A
// datagram queued at either, after both were empty a while, is taken
// within a few receives, from the port it came to; one at each both
// arrive, in whichever order.
TEST_CASE("RoCE port: a context's two sockets each deliver within a few receives, a quiet one too", "[nic][roce]") {
  TempDir dir("usrc-roce-idle");
  std::mt19937 rng(std::random_device{}());
  std::unique_ptr<net::UdpNic> nic;
  uint16_t own = 0;
  for (int i = 0; i < 50 && !nic; i++) {
    own = uint16_t(30000 + rng() % 10000);
    int e = 0;
    std::string err;
    nic = net::UdpNic::open({kLo, own}, 1 << 20, 32, 1, &e, &err);
  }
  REQUIRE(nic);
  const uint16_t roce = uint16_t(40000 + rng() % 20000);
  std::string err;
  INFO(err);
  REQUIRE(nic->join_roce(roce, 3, dir.path, 1 << 20, &err));
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  auto send_to = [&](uint16_t port, uint32_t index) {
    const std::vector<uint8_t> d = datagram(3, index);
    sockaddr_in to = net::to_sockaddr({kLo, port});
    REQUIRE(::sendto(s, d.data(), d.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof to) == ssize_t(d.size()));
    pollfd p{nic->wait_fd(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);   // (queued at its socket)
  };
  // The receives it takes to get one datagram (0: none within 64).
  auto receives = [&](uint16_t dst_port) {
    net::RxPacket pk[4];
    for (int k = 1; k <= 64; k++)
      if (size_t n = nic->recv(pk)) {
        CHECK(n == 1);
        CHECK(pk[0].dst_port == (dst_port == roce ? roce : 0));
        return k;
      }
    return 0;
  };
  net::RxPacket pk[4];
  for (uint16_t port : {roce, own, roce, own}) {
    for (int i = 0; i < 100; i++) REQUIRE(nic->recv(pk) == 0);   // both empty a while
    send_to(port, 1);
    const int k = receives(port);
    INFO("port " << port);
    CHECK(k >= 1);
    CHECK(k <= 4);
  }
  // After a long quiet (a poll that finds nothing then looks at each
  // socket only now and then), within 17 receives; after a wait woke, at
  // the first.
  for (uint16_t port : {roce, own}) {
    for (int i = 0; i < 5000; i++) REQUIRE(nic->recv(pk) == 0);
    send_to(port, 1);
    const int k = receives(port);
    INFO("port " << port);
    CHECK(k >= 1);
    CHECK(k <= 17);
    for (int i = 0; i < 5000; i++) REQUIRE(nic->recv(pk) == 0);
    send_to(port, 1);
    nic->end_wait();
    CHECK(receives(port) == 1);
  }
  // One at each: both arrive.
  send_to(own, 2);
  send_to(roce, 3);
  int got = 0;
  for (int k = 0; k < 64 && got < 2; k++) got += int(nic->recv(pk));
  CHECK(got == 2);
  ::close(s);
}
